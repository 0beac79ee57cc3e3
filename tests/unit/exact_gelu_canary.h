// `micro` with the exact GELU (`model.gelu = "erf"`): the shipped micro.toml with that one
// key added and its own name, written once into a scratch folder; returns the file's path.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include "canary_file.h"
#include "scratch_dir.h"

namespace harness::testing {

inline const std::string& micro_with_exact_gelu() {
  static const ScratchDir dir;
  static const std::string path = [] {
    std::ifstream in(canary::shipped_canary_dir() / "micro.toml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("name = \"micro\""), 14, "name = \"micro-erf\"");
    text.replace(text.find("[model]\n"), 8, "[model]\ngelu = \"erf\"\n");
    const std::string p = dir.path("micro-erf.toml");
    std::ofstream(p) << text;
    return p;
  }();
  return path;
}

}  // namespace harness::testing
