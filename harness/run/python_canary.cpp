#include "python_canary.h"

#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "file_io.h"

namespace harness::run {
namespace {

// The JSON text of a manifest attribute, or null where it is missing or not JSON.
nlohmann::json manifest_json(const std::map<std::string, std::string>& manifest, const std::string& key) {
  const auto it = manifest.find(key);
  if (it == manifest.end()) return nullptr;
  return nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

std::map<std::string, std::string> harness_environment() {
  std::map<std::string, std::string> environment;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) environment["HARNESS_BIN"] = self.string();
  return environment;
}

std::map<std::string, std::string> python_package_environment() {
  std::map<std::string, std::string> environment = harness_environment();
  environment["PYTHONPATH"] = std::string(HARNESS_SOURCE_DIR) + "/python";
  return environment;
}

bool is_python_canary(const std::map<std::string, std::string>& manifest) {
  const nlohmann::json canary = manifest_json(manifest, "canary");
  return canary.is_object() && canary.value("kind", "") == "python";
}

bool is_pack_lane(const std::map<std::string, std::string>& manifest) {
  const auto engine = manifest.find("engine"), pack = manifest.find("pack");
  return engine != manifest.end() && engine->second == "torch" && pack != manifest.end() && !pack->second.empty();
}

PythonCommand python_canary_command(const std::string& subcommand, const std::string& receipt,
                                    const std::map<std::string, std::string>& manifest,
                                    const std::vector<std::string>& flags) {
  std::string python = "/usr/bin/python3";
  const nlohmann::json recipe = manifest_json(manifest, "run_options");
  if (recipe.is_object() && recipe.contains("python") && recipe["python"].is_string()) {
    const std::string recorded = recipe["python"].get<std::string>();
    if (access(recorded.c_str(), X_OK) == 0) python = recorded;
  }
  PythonCommand command;
  command.argv = {python, "-m", "canary_harness", subcommand, receipt};
  command.argv.insert(command.argv.end(), flags.begin(), flags.end());
  command.environment = python_package_environment();
  return command;
}

PythonJsonResult run_python_for_json(std::vector<std::string> argv, const std::map<std::string, std::string>& environment,
                                     ChildOutput stdout_mode, ChildOutput stderr_mode) {
  const TempDir work("python-json", "a Python child's result");
  const std::string out = work.file("result.json");
  argv.insert(argv.end(), {"--json-out", out});
  PythonJsonResult r;
  r.child = run_child(argv, environment, stdout_mode, stderr_mode);
  const std::string text = read_file(out);  // "" when the child wrote none: discarded below
  r.result = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return r;
}

}  // namespace harness::run
