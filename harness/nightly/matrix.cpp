#include "matrix.h"

#include <charconv>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "preset.h"
#include "registry.h"

namespace harness::nightly {
namespace {

inline constexpr std::int64_t kMatrixSchemaVersion = 1;
inline constexpr const char* kLaneKeys[] = {"id", "engine", "features", "why", "triage-with"};

bool is_engine_flag(const std::string& key) {
  for (const char* name : kAccelFlagNames) {
    if (key == name) return true;
  }
  for (const char* name : kMeshFlagNames) {
    if (key == name) return true;
  }
  return false;
}

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  Matrix parse() {
    toml::table root;
    try {
      root = toml::parse_file(path_);
    } catch (const toml::parse_error& e) {
      fail(fmt::format("line {}: {}", e.source().begin.line, e.description()));
    }
    for (auto&& [key, node] : root) {
      static const std::set<std::string> known{"schema_version", "canary", "steps", "seed", "reference", "trace", "lanes"};
      if (!known.count(std::string(key.str()))) {
        fail(fmt::format("{}: unknown key (allowed: {})", key.str(), fmt::join(known, ", ")));
      }
    }
    const auto version = root["schema_version"].value<std::int64_t>();
    if (version != kMatrixSchemaVersion) {
      fail(fmt::format("schema_version: must be {}, the version this harness reads", kMatrixSchemaVersion));
    }
    Matrix m;
    m.path = path_;
    m.content_hash = run::file_content_hash(path_);
    m.canary = text(root, "canary", "canary", true);
    try {
      canary::preset(m.canary);
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("canary: {}", e.what()));
    }
    m.steps = static_cast<int>(integer(root, "steps", 1, 1000000));
    m.seed = integer(root, "seed", 0, std::numeric_limits<std::int64_t>::max());
    m.reference = text(root, "reference", "reference", true);
    m.trace = text(root, "trace", "trace", false);
    if (m.trace.empty()) m.trace = "none";
    if (m.trace != "none" && m.trace != "ops") fail(fmt::format("trace: '{}' is not a trace level; use none or ops", m.trace));
    const toml::array* lanes = root["lanes"].as_array();
    if (!lanes || lanes->empty()) fail("lanes: missing; give at least one [[lanes]] table");
    for (std::size_t i = 0; i < lanes->size(); ++i) m.lanes.push_back(lane(m, (*lanes)[i], i));
    check_references(m);
    return m;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw MatrixError(fmt::format("{}: {}", path_, what)); }

  std::string text(const toml::table& t, const char* key, const std::string& where, bool required) const {
    const auto v = t[key].value<std::string>();
    if ((!v && (required || t.contains(key))) || (v && v->empty() && required)) {
      fail(fmt::format("{}: must be a non-empty string", where));
    }
    return v.value_or("");
  }

  std::int64_t integer(const toml::table& t, const char* key, std::int64_t lo, std::int64_t hi) const {
    const auto v = t[key].value<std::int64_t>();
    if (!v || *v < lo || *v > hi) fail(fmt::format("{}: must be an integer in {}..{}", key, lo, hi));
    return *v;
  }

  // An engine flag's value as the command line would give it.
  std::string flag_value(const toml::node& node, const std::string& where) const {
    if (const auto s = node.value<std::string>()) return *s;
    if (const auto i = node.value<std::int64_t>(); i && node.is_integer()) return std::to_string(*i);
    if (const auto b = node.value<bool>(); b && node.is_boolean()) {
      if (*b) return "1";
      fail(fmt::format("{}: a switch is on (true) or absent", where));
    }
    fail(fmt::format("{}: must be a string or an integer", where));
  }

  LaneSpec lane(const Matrix& m, const toml::node& node, std::size_t index) {
    const std::string where = fmt::format("lanes[{}]", index);
    const toml::table* t = node.as_table();
    if (!t) fail(fmt::format("{}: must be a table ([[lanes]])", where));
    LaneSpec spec;
    spec.id = text(*t, "id", where + ".id", true);
    const std::string at = fmt::format("lanes[{}] ({})", index, spec.id);
    if (spec.id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_.") != std::string::npos) {
      fail(fmt::format("{}.id: use lower-case letters, digits, '-', '_' and '.' (it names files)", at));
    }
    spec.engine = text(*t, "engine", at + ".engine", true);
    spec.settings.features = text(*t, "features", at + ".features", false);
    spec.why = text(*t, "why", at + ".why", false);
    spec.triage_with = text(*t, "triage-with", at + ".triage-with", false);
    for (auto&& [key, value] : *t) {
      const std::string k(key.str());
      if (is_engine_flag(k)) {
        spec.settings.options[k] = flag_value(value, at + "." + k);
      } else if (std::find(std::begin(kLaneKeys), std::end(kLaneKeys), k) == std::end(kLaneKeys)) {
        fail(fmt::format("{}.{}: unknown key (allowed: {} and the engine's flags, e.g. mesh, noise-seed)", at, k,
                         fmt::join(kLaneKeys, ", ")));
      }
    }
    try {
      const auto engine = make_engine(spec.engine, spec.settings);
      spec.lane = run::lane_name(m.canary, engine->lane_engine(), engine->features());
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("{}: {}", at, e.what()));
    }
    return spec;
  }

  void check_references(const Matrix& m) const {
    std::set<std::string> ids, names;
    for (const LaneSpec& l : m.lanes) {
      if (!ids.insert(l.id).second) fail(fmt::format("lanes: id '{}' appears twice", l.id));
      if (!names.insert(l.lane).second) {
        fail(fmt::format("lanes ({}): lane {} appears twice; two lanes of one name would share a golden", l.id, l.lane));
      }
    }
    if (!ids.count(m.reference)) fail(fmt::format("reference: '{}' is not the id of a lane", m.reference));
    for (const LaneSpec& l : m.lanes) {
      if (l.triage_with.empty()) continue;
      if (!l.runs_fp8()) fail(fmt::format("lanes ({}).triage-with: the lane runs no fp8; triage explains fp8 lanes", l.id));
      if (!ids.count(l.triage_with)) fail(fmt::format("lanes ({}).triage-with: '{}' is not a lane id", l.id, l.triage_with));
      if (m.lane(l.triage_with).runs_fp8()) {
        fail(fmt::format("lanes ({}).triage-with: '{}' runs fp8 itself; name the bf16-only twin", l.id, l.triage_with));
      }
    }
  }

  std::string path_;
};

}  // namespace

bool LaneSpec::runs_fp8() const { return settings.features.find("fp8") != std::string::npos; }

const LaneSpec& Matrix::lane(const std::string& id) const {
  for (const LaneSpec& l : lanes) {
    if (l.id == id) return l;
  }
  throw MatrixError(fmt::format("{}: no lane '{}'", path, id));
}

run::RunOptions Matrix::run_options(const LaneSpec& spec, const std::string& out) const {
  run::RunOptions o;
  o.canary = canary;
  o.engine = spec.engine;
  o.engine_settings = spec.settings;
  o.steps = steps;
  o.seed = seed;
  o.trace = trace;
  o.out = out;
  return o;
}

Matrix load_matrix(const std::string& path) {
  std::ifstream probe(path);
  if (!probe) throw MatrixError(fmt::format("{}: cannot read the matrix file; give one with --matrix", path));
  return Parser(path).parse();
}

std::vector<const LaneSpec*> select_lanes(const Matrix& matrix, const std::string& text, const std::string& flag) {
  std::vector<const LaneSpec*> selected;
  if (text.empty()) {
    for (const LaneSpec& l : matrix.lanes) selected.push_back(&l);
    return selected;
  }
  for (const std::string& item : split_list(text)) {
    const auto it = std::find_if(matrix.lanes.begin(), matrix.lanes.end(),
                                 [&](const LaneSpec& l) { return l.id == item || l.lane == item; });
    if (it == matrix.lanes.end()) {
      std::vector<std::string> ids;
      for (const LaneSpec& l : matrix.lanes) ids.push_back(l.id);
      throw MatrixError(fmt::format("{}: '{}' is not a lane of {} (lanes: {})", flag, item, matrix.path, fmt::join(ids, ", ")));
    }
    if (std::find(selected.begin(), selected.end(), &*it) == selected.end()) selected.push_back(&*it);
  }
  return selected;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (std::size_t comma = text.find(','); comma != std::string::npos; comma = text.find(',', start)) {
    items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  items.push_back(text.substr(start));
  return items;
}

Shard parse_shard(const std::string& text) {
  Shard s;
  const auto slash = text.find('/');
  auto number = [](const std::string& part, int& out) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), out);
    return !part.empty() && ec == std::errc() && end == part.data() + part.size();
  };
  if (slash == std::string::npos || !number(text.substr(0, slash), s.index) || !number(text.substr(slash + 1), s.count) ||
      s.count < 1 || s.count > 1000 || s.index < 0 || s.index >= s.count) {
    throw MatrixError(fmt::format("--shard: '{}' is not i/N with 0 <= i < N (e.g. 0/2 and 1/2)", text));
  }
  return s;
}

std::vector<const LaneSpec*> shard_lanes(const Matrix& matrix, const Shard& shard) {
  std::vector<const LaneSpec*> lanes;
  for (std::size_t k = 0; k < matrix.lanes.size(); ++k) {
    if (static_cast<int>(k % static_cast<std::size_t>(shard.count)) == shard.index) lanes.push_back(&matrix.lanes[k]);
  }
  return lanes;
}

}  // namespace harness::nightly
