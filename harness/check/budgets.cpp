#include "budgets.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "false_alarm.h"
#include "receipt/budget_features.h"

namespace harness::check {
namespace {

inline constexpr std::int64_t kBudgetsSchemaVersion = 1;
// The tables that are not feature entries (docs/budgets.md); every other table is a feature
// entry ([bf16]) or one canary's feature entries ([tiny.bf16]).
inline constexpr const char* kRuleSections[] = {"compile-stability", "memory", "data", "default-entries"};

bool is_rule_section(const std::string& key) {
  return std::find(std::begin(kRuleSections), std::end(kRuleSections), key) != std::end(kRuleSections);
}

// Feature and canary names: a feature name's rule ('+' joins a receipt's features).
bool valid_name(const std::string& name) { return receipt::BudgetFeatures::is_name(name); }

// A canary's group: no `form` of its own, and nothing but tables ([tiny.bf16], ...).
bool is_canary_group(const toml::table& t) {
  return !t.empty() && !t.contains("form") &&
         std::all_of(t.begin(), t.end(), [](auto&& entry) { return entry.second.is_table(); });
}

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  Budgets parse() {
    toml::table root;
    try {
      root = toml::parse_file(path_);
    } catch (const toml::parse_error& e) {
      fail(fmt::format("line {}: {}", e.source().begin.line, e.description()));
    }
    const auto version = root["schema_version"].value<std::int64_t>();
    if (!version) fail("schema_version: missing; this harness reads budgets schema_version 1");
    if (*version != kBudgetsSchemaVersion) {
      fail(fmt::format("schema_version: {} is not {}, the version this harness reads", *version, kBudgetsSchemaVersion));
    }
    Budgets budgets;
    budgets.path = path_;
    budgets.compile_stability = compile_stability(section(root, "compile-stability"));
    budgets.memory = memory(section(root, "memory"));
    data(section(root, "data"));
    if (root.contains("default-entries")) budgets.default_entry_canaries = default_entries(section(root, "default-entries"));
    for (auto&& [key, node] : root) {
      const std::string k(key.str());
      if (k == "schema_version" || is_rule_section(k)) continue;
      const toml::table* t = node.as_table();
      if (!t) {
        fail(fmt::format("{}: not a table; a feature entry is [{}], one canary's entries are [{}.FEATURE]", k, k, k));
      }
      if (!is_canary_group(*t)) {
        budgets.features[k] = feature(*t, k, k);
        continue;
      }
      if (!valid_name(k)) fail(fmt::format("[{}]: a canary name is letters, digits, '-' and '_'", k));
      for (auto&& [sub, entry] : *t) {
        const std::string name(sub.str());
        if (name == "compile-stability") {  // the canary's own warm-up (its optimizer's lazy state, ...)
          budgets.per_canary_compile_stability[k] = compile_stability(*entry.as_table(), "[" + k + ".compile-stability]");
          continue;
        }
        if (is_rule_section(name)) {
          fail(fmt::format("[{}.{}]: only feature entries and compile-stability are keyed per canary ({} holds for "
                           "every canary)", k, name, name));
        }
        budgets.per_canary[k][name] = feature(*entry.as_table(), name, k + "." + name);
      }
    }
    if (!budgets.features.count("reference")) {  // the bitwise rule every file states
      fail("[reference]: missing; every budgets file states the bitwise rule (docs/budgets.md)");
    }
    check_across_platforms(budgets);
    return budgets;
  }

 private:
  // Every across_platforms names an entry of the file, for every canary or the same one.
  void check_across_platforms(const Budgets& budgets) const {
    const auto check = [&](const FeatureBudget& f, const std::string& canary) {
      if (f.across_platforms.empty() || budgets.find(f.across_platforms, canary)) return;
      fail(fmt::format("[{}].across_platforms: no entry [{}] in this file", f.key(), f.across_platforms));
    };
    for (const auto& [name, f] : budgets.features) check(f, "");
    for (const auto& [canary, entries] : budgets.per_canary) {
      for (const auto& [name, f] : entries) check(f, canary);
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw BudgetError(fmt::format("{}: {}", path_, what));
  }

  const toml::table& section(const toml::table& root, const char* name) const {
    const toml::table* t = root[name].as_table();
    if (!t) fail(fmt::format("[{}]: missing; every budgets file has one (docs/budgets.md)", name));
    return *t;
  }

  void only_keys(const toml::table& t, const std::string& where, std::set<std::string> allowed) const {
    for (auto&& [key, node] : t) {
      if (!allowed.count(std::string(key.str()))) {
        fail(fmt::format("{}.{}: unknown key (allowed: {})", where, key.str(), fmt::join(allowed, ", ")));
      }
    }
  }

  double non_negative(const toml::node_view<const toml::node>& node, const std::string& key) const {
    if (!node) return 0;
    const auto v = node.value<double>();
    if (!v || !std::isfinite(*v) || *v < 0) fail(fmt::format("{}: must be a non-negative number", key));
    return *v;
  }

  std::string text(const toml::table& t, const std::string& where, const char* key, bool required) const {
    const auto v = t[key].value<std::string>();
    if (!v && (required || t.contains(key))) fail(fmt::format("{}.{}: must be a string", where, key));
    return v.value_or("");
  }

  // "A-B" (inclusive) or "A-" (to the last step).
  std::pair<int, int> steps(const std::string& spec, const std::string& key) const {
    const auto dash = spec.find('-');
    int first = 0, last = std::numeric_limits<int>::max();
    auto number = [&](const std::string& s, int& out) {
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
      return !s.empty() && ec == std::errc() && end == s.data() + s.size() && out >= 0;
    };
    const bool ok = dash != std::string::npos && number(spec.substr(0, dash), first) &&
                    (dash + 1 == spec.size() || number(spec.substr(dash + 1), last)) && first <= last;
    if (!ok) fail(fmt::format("{}: '{}' is not a step window 'A-B' or 'A-'", key, spec));
    return {first, last};
  }

  std::vector<Window> windows(const toml::array& array, const std::string& where) const {
    std::vector<Window> out;
    for (std::size_t i = 0; i < array.size(); ++i) {
      const std::string key = fmt::format("{}[{}]", where, i);
      const toml::table* t = array[i].as_table();
      if (!t) fail(fmt::format("{}: must be a table {{ steps = \"A-B\", atol = .., rtol = .., ulp = .. }}", key));
      only_keys(*t, key, {"steps", "from", "atol", "rtol", "ulp"});
      const auto spec = (*t)["steps"].value<std::string>();
      if (!spec) fail(fmt::format("{}.steps: missing (a window 'A-B' or 'A-')", key));
      Window w;
      std::tie(w.first, w.last) = steps(*spec, key + ".steps");
      const std::string from = text(*t, key, "from", false);
      if (!from.empty() && from != kFromDecisionsPart) {
        fail(fmt::format("{}.from: '{}' is not an anchor; the one anchor is \"{}\" (steps counted from the step "
                         "where the runs' recorded decisions part)", key, from, kFromDecisionsPart));
      }
      w.from_decisions_part = !from.empty();
      w.atol = non_negative((*t)["atol"], key + ".atol");
      w.rtol = non_negative((*t)["rtol"], key + ".rtol");
      w.ulp = non_negative((*t)["ulp"], key + ".ulp");
      for (const Window& earlier : out) {
        const bool same_anchor = w.from_decisions_part == earlier.from_decisions_part;
        if (same_anchor && w.first <= earlier.last && earlier.first <= w.last) {
          fail(fmt::format("{}.steps: overlaps an earlier window", key));
        }
      }
      out.push_back(w);
    }
    return out;
  }

  // A calendar date YYYY-MM-DD, as calibrate writes it: the day the numbers were measured.
  void check_date(const std::string& date, const std::string& key) const {
    const auto digits = [&](std::size_t from, std::size_t count) {
      int value = 0;
      for (std::size_t i = from; i < from + count; ++i) {
        if (date[i] < '0' || date[i] > '9') return -1;
        value = value * 10 + (date[i] - '0');
      }
      return value;
    };
    const bool shaped = date.size() == 10 && date[4] == '-' && date[7] == '-';
    const int year = shaped ? digits(0, 4) : -1, month = shaped ? digits(5, 2) : -1, day = shaped ? digits(8, 2) : -1;
    const std::chrono::year_month_day ymd{std::chrono::year{year}, std::chrono::month{static_cast<unsigned>(month)},
                                          std::chrono::day{static_cast<unsigned>(day)}};
    if (year < 0 || month < 0 || day < 0 || !ymd.ok()) {
      fail(fmt::format("{}: '{}' is not a date YYYY-MM-DD (the day these numbers were measured)", key, date));
    }
  }

  // `power` (harness calibrate --power): what the lane's check caught under the entry, a
  // record for readers; checked for its shape only.
  void check_power(const toml::table& t, const std::string& where) const {
    if (!t.contains("power")) return;
    const toml::table* power = t["power"].as_table();
    if (!power) fail(fmt::format("{}.power: must be a table {{ lane = ..., weight_scale = ..., ... }}", where));
    only_keys(*power, where + ".power",
              {"lane", "against", "step", "tensor", "weight_scale", "weight_ulps", "lr_scale", "eps_scale", "too_loose"});
    if (const auto against = (*power)["against"].value<std::string>(); (*power)["against"] && against != "golden") {
      fail(fmt::format("{}.power.against: \"golden\" (measured against the lane's golden) or absent (against the "
                       "reference lane)", where));
    }
    for (const char* key : {"weight_scale", "weight_ulps", "lr_scale", "eps_scale"}) {
      const toml::node_view<const toml::node> v = (*power)[key];
      if (v && !v.is_number() && !(v.is_string() && v.value<std::string>()->starts_with("none up to "))) {
        fail(fmt::format("{}.power.{}: the smallest size caught, or \"none up to X\"", where, key));
      }
    }
  }

  // An array of non-empty strings (none when absent).
  std::vector<std::string> strings(const toml::table& t, const std::string& where, const char* key) const {
    if (!t.contains(key)) return {};
    const toml::array* list = t[key].as_array();
    if (!list) fail(fmt::format("{}.{}: must be an array of strings", where, key));
    std::vector<std::string> out;
    for (const toml::node& item : *list) {
      const auto value = item.value_exact<std::string>();
      if (!value || value->empty()) fail(fmt::format("{}.{}: every item is a non-empty string", where, key));
      out.push_back(*value);
    }
    return out;
  }

  // A non-negative integer key (0 when absent).
  int non_negative_int(const toml::table& t, const std::string& where, const char* key) const {
    if (!t.contains(key)) return 0;
    const auto n = t[key].value<std::int64_t>();
    if (!n || *n < 0 || *n > std::numeric_limits<int>::max()) fail(fmt::format("{}.{}: must be a non-negative integer", where, key));
    return static_cast<int>(*n);
  }

  Provenance provenance(const toml::table& t, const std::string& where) const {
    Provenance p;
    p.calibrated = text(t, where, "calibrated", false);
    if (!p.calibrated.empty()) check_date(p.calibrated, where + ".calibrated");
    p.method = text(t, where, "method", false);
    p.repeats = non_negative_int(t, where, "repeats");
    p.samples = t.contains("samples") ? non_negative_int(t, where, "samples") : p.repeats;  // older files say repeats
    check_power(t, where);
    p.host_variants = strings(t, where, "host_variants");
    p.host_cpus = strings(t, where, "host_cpus");
    p.held_out = non_negative_int(t, where, "held_out");
    p.held_out_outside = non_negative_int(t, where, "held_out_outside");
    if (p.held_out_outside > p.held_out) {
      fail(fmt::format("{}.held_out_outside: {} of {} held-out samples; it counts some of them", where,
                       p.held_out_outside, p.held_out));
    }
    if (t.contains("observed") && !t["observed"].as_table()) {
      fail(fmt::format("{}.observed: must be a table {{ metric = largest difference seen, ... }}", where));
    }
    if (const toml::table* observed = t["observed"].as_table()) {
      for (auto&& [key, node] : *observed) {
        const std::string metric(key.str());
        p.observed[metric] = non_negative(toml::node_view<const toml::node>(node), where + ".observed." + metric);
      }
    }
    return p;
  }

  // The entry of feature `name` in table `t`, [key] in the file (key: name, or canary.name).
  FeatureBudget feature(const toml::table& t, const std::string& name, const std::string& key) const {
    const std::string where = fmt::format("[{}]", key);
    if (!valid_name(name)) fail(fmt::format("{}: a feature name is letters, digits, '-' and '_'", where));
    only_keys(t, where, {"form", "rationale", "calibrated", "repeats", "samples", "method", "observed", "held_out",
                         "held_out_outside", "host_variants", "host_cpus", "power", "outlier_fraction",
                         "loss", "grad_norm", "params_sketch", "logit_kl", "logprob_delta", "top1_mismatch",
                         "across_platforms", "bias", "triage_twin"});
    FeatureBudget f;
    f.name = name;
    f.section = key;
    const std::string form = text(t, where, "form", true);
    if (form != "bitwise" && form != "tolerance") fail(fmt::format("{}.form: '{}' is not bitwise or tolerance", where, form));
    f.bitwise = form == "bitwise";
    f.rationale = text(t, where, "rationale", true);
    f.provenance = provenance(t, where);
    f.across_platforms = text(t, where, "across_platforms", false);
    if (!f.across_platforms.empty() && !valid_name(f.across_platforms)) {
      fail(fmt::format("{}.across_platforms: '{}' is not a feature name", where, f.across_platforms));
    }
    f.outlier_fraction = non_negative(t["outlier_fraction"], where + ".outlier_fraction");
    if (f.outlier_fraction >= 1) fail(fmt::format("{}.outlier_fraction: must be below 1", where));
    const std::string bias = text(t, where, "bias", false);
    if (!bias.empty() && bias != "warn" && bias != "fail") {
      fail(fmt::format("{}.bias: '{}' is not warn or fail (what one-sided drift over repeats does)", where, bias));
    }
    f.bias_fails = bias == "fail";
    f.triage_twin = text(t, where, "triage_twin", false);
    if (!f.triage_twin.empty() && key != name) {
      fail(fmt::format("{}.triage_twin: triage is declared on the feature's own entry [{}], for every canary", where,
                       name));
    }
    using Metrics = std::span<const char* const>;
    for (const Metrics metrics : {Metrics(kBudgetMetrics), Metrics(kEvalMetrics)}) {
      for (const char* metric : metrics) {
        if (!t.contains(metric)) continue;
        const toml::array* array = t[metric].as_array();
        if (!array) fail(fmt::format("{}.{}: must be an array of step windows", where, metric));
        if (f.bitwise) fail(fmt::format("{}.{}: a bitwise entry takes no windows", where, metric));
        f.metrics[metric] = windows(*array, where + "." + metric);
      }
    }
    const bool steps_bounded = std::any_of(std::begin(kBudgetMetrics), std::end(kBudgetMetrics),
                                           [&](const char* m) { return f.metrics.count(m) > 0; });
    if (!f.bitwise && !steps_bounded) {
      fail(fmt::format("{}: a tolerance entry needs windows for loss, grad_norm or params_sketch", where));
    }
    if (!f.bitwise && f.provenance.calibrated.empty()) fail(fmt::format("{}.calibrated: missing (when were these numbers measured?)", where));
    return f;
  }

  // [compile-stability], or a canary's own [NAME.compile-stability] (`where`).
  CompileStabilityBudget compile_stability(const toml::table& t, const std::string& where = "[compile-stability]") const {
    only_keys(t, where, {"rationale", "warmup_steps", "max_uncached_compiles", "max_host_syncs"});
    text(t, where, "rationale", true);
    CompileStabilityBudget c;
    if (t.contains("warmup_steps")) {
      const auto steps = t["warmup_steps"].value<std::int64_t>();
      if (!steps || *steps < 0 || *steps > std::numeric_limits<int>::max()) {
        fail(fmt::format("{}.warmup_steps: must be a non-negative integer", where));
      }
      c.warmup_steps = static_cast<int>(*steps);
    }
    c.max_uncached_compiles = non_negative(t["max_uncached_compiles"], where + ".max_uncached_compiles");
    c.max_host_syncs = non_negative(t["max_host_syncs"], where + ".max_host_syncs");
    return c;
  }

  MemoryBudget memory(const toml::table& t) const {
    only_keys(t, "[memory]", {"rationale", "rtol"});
    text(t, "[memory]", "rationale", true);
    return MemoryBudget{non_negative(t["rtol"], "[memory].rtol")};
  }

  std::set<std::string> default_entries(const toml::table& t) const {
    only_keys(t, "[default-entries]", {"rationale", "canaries"});
    text(t, "[default-entries]", "rationale", true);
    const toml::array* list = t["canaries"].as_array();
    if (!list) fail("[default-entries].canaries: must be an array of canary names, e.g. [\"tiny\"]");
    std::set<std::string> names;
    for (const toml::node& item : *list) {
      const auto name = item.value_exact<std::string>();
      if (!name || !valid_name(*name)) fail("[default-entries].canaries: every item is a canary name (letters, digits, '-', '_')");
      names.insert(*name);
    }
    return names;
  }

  // The data contract cannot be loosened: batch hashes are always compared exactly.
  void data(const toml::table& t) const {
    only_keys(t, "[data]", {"form", "rationale"});
    text(t, "[data]", "rationale", true);
    if (text(t, "[data]", "form", true) != "bitwise") {
      fail("[data].form: must be bitwise; the data contract (batch hashes) is never a tolerance");
    }
  }

  std::string path_;
};

}  // namespace

const FeatureBudget& Budgets::feature(const std::string& name) const {
  const auto it = features.find(name);
  if (it == features.end()) throw BudgetError(fmt::format("{}: no [{}] entry", path, name));
  return it->second;
}

bool Budgets::uses_default_entries(const std::string& canary) const {
  return canary.empty() || default_entry_canaries.count(canary) > 0;
}

const CompileStabilityBudget& Budgets::compile_stability_of(const std::string& canary) const {
  const auto own = per_canary_compile_stability.find(canary);
  return own == per_canary_compile_stability.end() ? compile_stability : own->second;
}

const FeatureBudget* Budgets::find(const std::string& name, const std::string& canary) const {
  if (const auto group = per_canary.find(canary); group != per_canary.end()) {
    if (const auto it = group->second.find(name); it != group->second.end()) return &it->second;
  }
  const auto it = features.find(name);
  if (it == features.end() || !(it->second.bitwise || uses_default_entries(canary))) return nullptr;
  return &it->second;
}

bool Budgets::describes(const std::string& name) const {
  return features.count(name) > 0 || std::any_of(per_canary.begin(), per_canary.end(),
                                                 [&](const auto& group) { return group.second.count(name) > 0; });
}

Budgets load_budgets(const std::string& path) {
  if (!std::ifstream(path)) throw BudgetError(fmt::format("{}: cannot read the budgets file; give one with --budgets", path));
  return Parser(path).parse();
}

bool ComposedBudget::bitwise() const {
  return std::all_of(parts_.begin(), parts_.end(), [](const FeatureBudget* f) { return f->bitwise; });
}

bool Window::covers(int step, int since_part) const {
  const int counted = from_decisions_part ? since_part : step;
  return counted != kDecisionsNeverPart && counted >= first && counted <= last;
}

double Window::allowance(double reference) const {
  return atol + rtol * std::fabs(reference) + (ulp != 0 ? ulp * fp32_ulp(reference) : 0.0);
}

double windows_allowance(const std::vector<Window>& windows, int step, int since_part, double reference) {
  double total = 0;
  for (const Window& w : windows) {
    if (w.covers(step, since_part)) total += w.allowance(reference);
  }
  return total;
}

double ComposedBudget::allowed(const std::string& metric, int step, double reference) const {
  return allowed(metric, step, reference, steps_since_part(step, decisions_part_));
}

double ComposedBudget::allowed(const std::string& metric, int step, double reference, int since_part) const {
  double total = 0;
  for (const FeatureBudget* f : parts_) {
    const auto it = f->metrics.find(metric);
    if (it != f->metrics.end()) total += windows_allowance(it->second, step, since_part, reference);
  }
  return total;
}

bool ComposedBudget::bounds(const std::string& metric) const {
  return std::all_of(parts_.begin(), parts_.end(),
                     [&](const FeatureBudget* f) { return f->bitwise || f->metrics.count(metric) > 0; });
}

double ComposedBudget::outlier_fraction() const {
  double fraction = 0;
  for (const FeatureBudget* f : parts_) fraction = std::max(fraction, f->outlier_fraction);
  return fraction;
}

std::vector<std::string> ComposedBudget::names() const {
  std::vector<std::string> out;
  for (const FeatureBudget* f : parts_) {
    if (!f->bitwise) out.push_back(f->key());
  }
  if (out.empty()) out.emplace_back("reference");
  return out;
}

std::optional<double> FeatureBudget::false_alarm_bound() const {
  if (bitwise) return 0.0;
  if (provenance.held_out == 0) return std::nullopt;
  return false_alarm_upper_bound(provenance.held_out_outside, provenance.held_out);
}

std::vector<const FeatureBudget*> ComposedBudget::provisional_parts() const {
  std::vector<const FeatureBudget*> out;
  std::copy_if(parts_.begin(), parts_.end(), std::back_inserter(out), [](const FeatureBudget* f) { return f->provisional(); });
  return out;
}

// The distance from |x| (as fp32) to the next fp32 up; exact from the bits, no libm.
double fp32_ulp(double x) {
  const float value = static_cast<float>(x);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  bits &= 0x7FFFFFFFu;  // |x|, -0 included
  float f = 0;
  std::memcpy(&f, &bits, sizeof f);
  if (!(f < std::numeric_limits<float>::max())) return std::numeric_limits<double>::infinity();
  ++bits;
  float next = 0;
  std::memcpy(&next, &bits, sizeof next);
  return static_cast<double>(next) - static_cast<double>(f);
}

}  // namespace harness::check
