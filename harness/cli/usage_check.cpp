#include "usage_check.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::cli {
namespace {

// ", did you mean 'X'?" when a candidate is close enough to be the likely intent.
std::string suggestion(const std::string& typed, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = 0;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(typed, c);
    if (!best || d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  const std::size_t close_enough = std::max<std::size_t>(2, typed.size() / 3);
  return best && best_distance <= close_enough ? fmt::format("; did you mean '{}'?", *best) : "";
}

std::vector<std::string> subcommand_names(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> long_flags(CLI::App& app) {
  std::vector<std::string> flags;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& name : opt->get_lnames()) flags.push_back("--" + name);
  }
  return flags;
}

std::string where(const std::vector<std::string>& path) {
  return path.empty() ? "harness" : fmt::format("harness {}", fmt::join(path, " "));
}

}  // namespace

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: a swapped pair of letters counts once.
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

static CLI::App* find_subcommand(CLI::App& app, const std::string& name) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

std::optional<std::string> usage_problem(CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "-h" || arg == "--help" || arg == "--help-all" || arg == "--version") return std::nullopt;
  }
  CLI::App* level = &app;
  std::vector<std::string> path;
  bool value_expected = false;  // the previous flag takes this token as its value
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (value_expected) {
      value_expected = false;
      continue;
    }
    if (arg.starts_with("--")) {
      const std::string name = arg.substr(0, arg.find('='));
      const CLI::Option* opt = level->get_option_no_throw(name);
      if (!opt) {
        return fmt::format("unknown flag '{}' of `{}`{} (see `{} --help`)", name, where(path),
                           suggestion(name, long_flags(*level)), where(path));
      }
      value_expected = arg.find('=') == std::string::npos && opt->get_items_expected_min() > 0;
      continue;
    }
    if (arg.starts_with("-")) continue;  // short flags and negative numbers: CLI11 judges them
    const std::vector<std::string> subs = subcommand_names(*level);
    if (subs.empty()) continue;  // a positional argument of the selected command
    CLI::App* sub = find_subcommand(*level, arg);
    if (!sub) {
      return fmt::format("unknown subcommand '{}' of `{}`{} (one of: {})", arg, where(path), suggestion(arg, subs),
                         fmt::join(subs, ", "));
    }
    level = sub;
    path.push_back(arg);
  }
  if (!subcommand_names(*level).empty() && level->get_require_subcommand_min() > 0) {
    return fmt::format("`{}` needs a subcommand: one of {} (see `{} --help`)", where(path),
                       fmt::join(subcommand_names(*level), ", "), where(path));
  }
  return std::nullopt;
}

CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::int64_t value = -1;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) {
          return fmt::format("'{}' is not a seed: want an integer between 0 and {}", text,
                             std::numeric_limits<std::int64_t>::max());
        }
        return "";
      },
      "SEED");
}

}  // namespace harness::cli
