#include "golden_store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_validator.h"
#include "run/full_receipt_schema.h"
#include "receipt/receipt_schema.h"
#include "stack_info.h"
#include "json_text.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;

inline constexpr const char* kCandidateSuffix = ".candidate.h5";
inline constexpr int kCandidatesVersion = 1;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<Candidate> without(std::vector<Candidate> candidates, const std::string& lane) {
  std::erase_if(candidates, [&](const Candidate& c) { return c.lane == lane; });
  return candidates;
}

// The content hash the log last recorded for each lane.
std::map<std::string, std::string> last_recorded(const std::vector<ProvenanceEntry>& log) {
  std::map<std::string, std::string> hashes;
  for (const ProvenanceEntry& e : log) hashes[e.lane] = e.new_hash;
  return hashes;
}

// The lanes whose last log entry approved a receipt made elsewhere (golden refresh --receipt).
std::vector<std::string> lanes_from_receipts(const std::vector<ProvenanceEntry>& log) {
  std::map<std::string, bool> from_receipt;
  for (const ProvenanceEntry& e : log) from_receipt[e.lane] = e.source == kSourceReceipt;
  std::vector<std::string> lanes;
  for (const auto& [lane, yes] : from_receipt) {
    if (yes) lanes.push_back(lane);
  }
  return lanes;
}

// How a lane's golden is made again: its lane run by refresh, or a receipt of it refreshed from.
std::string refresh_command(const LaneSpec& spec) {
  return spec.engine.empty() ? fmt::format("harness golden refresh --receipt R.h5 --reason TEXT (R.h5 a run of {})", spec.lane)
                             : fmt::format("harness golden refresh --lanes {} --reason TEXT", spec.id);
}

GoldenState inspect_golden(const LaneSpec& spec, const std::string& path, const std::map<std::string, std::string>& recorded) {
  GoldenState g{spec.id, spec.lane, path, "ok", "", "", false};
  if (!fs::exists(path)) {
    g.state = "missing";
    g.detail = fmt::format("create it: {}, then approve it", refresh_command(spec));
    return g;
  }
  g.content_hash = run::file_content_hash(path);
  const auto version = receipt_schema_version(path);
  if (!version) {
    g.state = "unreadable";
    g.detail = "not a harness receipt; refresh and approve the lane again";
  } else if (*version != receipt::kSchemaVersion) {
    g.state = "old-schema";
    g.detail = fmt::format("schema_version {} (this harness writes {}); refresh and approve the lane", *version,
                           receipt::kSchemaVersion);
  } else if (const auto it = recorded.find(spec.lane); it == recorded.end() || it->second != g.content_hash) {
    g.state = "unrecorded";
    g.detail = "its content hash is not the one the provenance log last recorded for the lane: changed outside "
               "`harness golden approve`; refresh and approve it";
  }
  return g;
}

// True when `lane` is <canary>/<name> and the log has recorded some lane of that canary.
bool records_canary(const std::map<std::string, std::string>& recorded, const std::string& lane) {
  const std::size_t slash = lane.find('/');
  if (slash == std::string::npos) return false;
  const std::string canary_prefix = lane.substr(0, slash + 1);
  const auto it = recorded.lower_bound(canary_prefix);
  return it != recorded.end() && it->first.starts_with(canary_prefix);
}

}  // namespace

nlohmann::json ProvenanceEntry::to_json() const {
  nlohmann::json j = {{"date_utc", date_utc}, {"lane", lane},       {"old_hash", old_hash.empty() ? nlohmann::json(nullptr) : nlohmann::json(old_hash)},
          {"new_hash", new_hash}, {"reason", reason},   {"approver", approver},
          {"git_commit", git_commit}, {"toolchain", toolchain}, {"comparison", comparison}};
  if (allow_dirty) j["allow_dirty"] = true;
  if (source != kSourceLane) j["source"] = source;  // lines of refreshed lanes stay as they were
  return j;
}

bool GoldenStatus::clean() const {
  return orphans.empty() && orphaned_candidates.empty() &&
         std::all_of(lanes.begin(), lanes.end(), [](const GoldenState& g) { return g.state == "ok"; });
}

nlohmann::json GoldenStatus::to_json() const {
  nlohmann::json lanes_json = nlohmann::json::array();
  for (const GoldenState& g : lanes) {
    lanes_json.push_back({{"id", g.id},
                          {"lane", g.lane},
                          {"path", g.path},
                          {"state", g.state},
                          {"detail", g.detail},
                          {"content_hash", g.content_hash},
                          {"candidate_pending", g.candidate_pending}});
  }
  return {{"version", 1}, {"clean", clean()}, {"lanes", lanes_json}, {"orphans", orphans},
          {"orphaned_candidates", orphaned_candidates}};
}

GoldenStore::GoldenStore(std::string directory) : dir_(std::move(directory)) {}

std::string GoldenStore::golden_path(const std::string& lane) const { return (fs::path(dir_) / (lane + ".h5")).string(); }
std::string GoldenStore::candidate_path(const std::string& lane) const {
  return (fs::path(dir_) / (lane + kCandidateSuffix)).string();
}
std::string GoldenStore::log_path() const { return (fs::path(dir_) / "provenance.jsonl").string(); }
std::string GoldenStore::review_path() const { return (fs::path(dir_) / "review.md").string(); }
std::string GoldenStore::candidates_path() const { return (fs::path(dir_) / "candidates.json").string(); }

GoldenStatus GoldenStore::status(const Matrix& matrix) const {
  if (!fs::is_directory(dir_)) throw GoldenError(fmt::format("--goldens: '{}' is not a directory", dir_));
  GoldenStatus status;
  const auto recorded = last_recorded(log());
  std::set<std::string> pending;
  for (const Candidate& c : candidates()) pending.insert(c.lane);
  std::set<std::string> known;
  std::vector<LaneSpec> lanes = matrix.lanes;
  std::vector<std::string> receipt_lanes = lanes_from_receipts(log());
  for (const Candidate& c : candidates()) {  // pending, not yet approved
    if (c.source == kSourceReceipt) receipt_lanes.push_back(c.lane);
  }
  for (const std::string& lane : receipt_lanes) {
    const bool listed = std::any_of(lanes.begin(), lanes.end(), [&](const LaneSpec& s) { return s.lane == lane; });
    if (!listed) {
      LaneSpec spec;  // no engine: a lane of no matrix, refreshed from a receipt; its id is its name
      spec.id = lane;
      spec.lane = lane;
      lanes.push_back(spec);
    }
  }
  for (const LaneSpec& spec : lanes) {
    GoldenState g = inspect_golden(spec, golden_path(spec.lane), recorded);
    g.candidate_pending = pending.count(spec.lane) > 0;
    if (g.candidate_pending && g.state == "missing") {
      g.detail = fmt::format("review {}, then: harness golden approve --lanes {} --approved-by NAME", review_path(), spec.id);
    }
    known.insert(fs::weakly_canonical(golden_path(spec.lane)).string());
    known.insert(fs::weakly_canonical(candidate_path(spec.lane)).string());
    status.lanes.push_back(g);
  }
  // Orphans are looked for among this canary's goldens only (goldens/<canary>/): another
  // canary's goldens belong to that canary's matrix (canaries/llama-nightly.toml).
  if (matrix.canary_name.empty()) return status;  // no matrix (status --no-matrix): no canary to look under
  const fs::path canary_dir = fs::path(dir_) / matrix.canary_name;
  if (!fs::is_directory(canary_dir)) return status;
  for (const auto& entry : fs::recursive_directory_iterator(canary_dir)) {
    const std::string path = entry.path().string();
    if (!entry.is_regular_file() || !ends_with(path, ".h5") || known.count(fs::weakly_canonical(path).string())) continue;
    (ends_with(path, kCandidateSuffix) ? status.orphaned_candidates : status.orphans).push_back(path);
  }
  std::sort(status.orphans.begin(), status.orphans.end());
  std::sort(status.orphaned_candidates.begin(), status.orphaned_candidates.end());
  return status;
}

std::vector<Candidate> GoldenStore::candidates() const {
  std::vector<Candidate> out;
  if (!fs::exists(candidates_path())) return out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(run::read_file(candidates_path()));
    for (const auto& c : j.at("candidates")) {
      out.push_back({c.at("id").get<std::string>(), c.at("lane").get<std::string>(), c.at("content_hash").get<std::string>(),
                     c.at("reason").get<std::string>(), c.at("refreshed_utc").get<std::string>(), c.at("comparison"),
                     c.value("source", std::string(kSourceLane)), c.value("aten_trace", std::string())});
    }
  } catch (const nlohmann::json::exception& e) {
    throw GoldenError(fmt::format("{}: not a candidates record ({}); run `harness golden reject` and refresh again",
                                  candidates_path(), run::json_error_text(e)));
  }
  return out;
}

void GoldenStore::write_candidates(const std::vector<Candidate>& candidates) const {
  if (candidates.empty()) {
    fs::remove(candidates_path());
    fs::remove(review_path());
    return;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const Candidate& c : candidates) {
    list.push_back({{"id", c.id},
                    {"lane", c.lane},
                    {"content_hash", c.content_hash},
                    {"reason", c.reason},
                    {"refreshed_utc", c.refreshed_utc},
                    {"comparison", c.comparison},
                    {"source", c.source}});
    if (!c.aten_trace.empty()) list.back()["aten_trace"] = c.aten_trace;
  }
  run::write_file_atomically(candidates_path(), run::json_text(nlohmann::json{{"version", kCandidatesVersion}, {"candidates", list}}) + "\n");
  write_review(candidates);
}

// The review report: what each candidate changes, for the person who approves it.
void GoldenStore::write_review(const std::vector<Candidate>& candidates) const {
  std::string text = "# Golden candidates awaiting review\n\n"
                     "Approve with `harness golden approve --lanes ID --approved-by NAME`, drop with "
                     "`harness golden reject --lanes ID`.\n";
  for (const Candidate& c : candidates) {
    const std::string golden = golden_path(c.lane);
    text += fmt::format("\n## {} ({})\n\n- reason: {}\n- refreshed: {}\n- candidate: `{}` ({})\n- golden: `{}` ({})\n"
                        "- against the golden: **{}**\n",
                        c.lane, c.id, c.reason, c.refreshed_utc, fs::relative(candidate_path(c.lane), dir_).string(),
                        c.content_hash, fs::relative(golden, dir_).string(),
                        fs::exists(golden) ? run::file_content_hash(golden) : "none yet",
                        c.comparison.value("verdict", "unknown"));
    if (!c.aten_trace.empty()) text += fmt::format("- aten trace: {}\n", c.aten_trace);
    if (c.comparison.contains("text")) text += fmt::format("\n```\n{}```\n", c.comparison["text"].get<std::string>());
  }
  run::write_file_atomically(review_path(), text);
}

void GoldenStore::add_candidate(const Candidate& candidate) {
  std::vector<Candidate> all = without(candidates(), candidate.lane);
  all.push_back(candidate);
  write_candidates(all);
}

void GoldenStore::drop_candidate(const std::string& lane) {
  check_bookkeeping();
  fs::remove(candidate_path(lane));
  write_candidates(without(candidates(), lane));
}

void GoldenStore::verify(const Candidate& candidate) const {
  const std::string from = candidate_path(candidate.lane);
  if (!fs::exists(from)) {
    throw GoldenError(fmt::format("{}: the candidate is gone; run `harness golden refresh --lanes {}` again", from, candidate.id));
  }
  const std::string hash = run::file_content_hash(from);
  if (hash != candidate.content_hash) {
    throw GoldenError(fmt::format("{}: changed since refresh ({} reviewed, {} now); refresh the lane again", from,
                                  candidate.content_hash, hash));
  }
  std::string lane;
  try {
    receipt::require_valid_receipt(from, run::full_receipt_schema());  // every byte checksummed, every dataset of the schema
    const receipt::ReceiptReader r(from);
    if (!r.complete()) throw GoldenError(fmt::format("{}: an incomplete receipt cannot become a golden", from));
    lane = r.manifest_string("lane");
  } catch (const receipt::ReceiptError& e) {
    throw GoldenError(fmt::format("{} (a candidate must validate to become a golden: refresh the lane again)", e.what()));
  }
  if (lane != candidate.lane) {
    throw GoldenError(fmt::format("{}: a receipt of lane {}, not {}; refresh the lane again", from, lane, candidate.lane));
  }
}

// The files promote() and drop_candidate() rewrite after the golden itself: checked first,
// so that a problem with them stops the change before anything is renamed.
void GoldenStore::check_bookkeeping() const {
  for (const std::string& path : {log_path(), candidates_path(), review_path()}) {
    if (fs::exists(path) && !fs::is_regular_file(path)) {
      throw GoldenError(fmt::format("{}: not a regular file; move it away (the goldens directory keeps its log, "
                                    "candidates and review there)",
                                    path));
    }
  }
  (void)log();  // a damaged log is refused now, not extended
}

void GoldenStore::verify_clean_build(const Candidate& candidate, bool allow_dirty) const {
  const std::string from = candidate_path(candidate.lane);
  const std::string commit = receipt::ReceiptReader(from).manifest_string("git_commit");
  if (commit.ends_with("-dirty") && !allow_dirty) {
    throw GoldenError(fmt::format("{}: built from a tree with uncommitted changes ({}); commit them, rebuild and refresh "
                                  "the lane, or pass --allow-dirty (recorded in the log)",
                                  from, commit));
  }
}

void GoldenStore::promote(const Candidate& candidate, const std::string& approver, bool allow_dirty) {
  verify(candidate);
  verify_clean_build(candidate, allow_dirty);
  check_bookkeeping();
  const std::string from = candidate_path(candidate.lane);
  const std::string to = golden_path(candidate.lane);
  std::map<std::string, std::string> manifest = receipt::ReceiptReader(from).manifest_text();
  ProvenanceEntry entry{run::utc_timestamp(), candidate.lane, fs::exists(to) ? run::file_content_hash(to) : "", candidate.content_hash,
                        candidate.reason, approver, manifest["git_commit"], manifest["toolchain"], candidate.comparison,
                        allow_dirty && manifest["git_commit"].ends_with("-dirty"), candidate.source};
  // Log first into a temporary copy, then the golden, then the log: an interruption
  // between the renames leaves a golden the log does not record, which `status` reports.
  std::string log_text = run::read_file(log_path());
  if (!log_text.empty() && log_text.back() != '\n') log_text += '\n';
  log_text += run::json_text(entry.to_json(), -1) + "\n";
  const std::string log_temp = log_path() + ".tmp";
  run::write_file_atomically(log_temp, log_text);
  fs::rename(from, to);
  fs::rename(log_temp, log_path());
  write_candidates(without(candidates(), candidate.lane));
}

std::vector<ProvenanceEntry> GoldenStore::log() const {
  std::vector<ProvenanceEntry> entries;
  std::ifstream in(log_path());
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      entries.push_back({j.at("date_utc"), j.at("lane"), j.at("old_hash").is_null() ? "" : j.at("old_hash").get<std::string>(),
                         j.at("new_hash"), j.at("reason"), j.at("approver"), j.at("git_commit"), j.at("toolchain"),
                         j.at("comparison"), j.value("allow_dirty", false), j.value("source", std::string(kSourceLane))});
    } catch (const nlohmann::json::exception& e) {
      throw GoldenError(fmt::format("{}:{}: not a provenance entry ({}); restore the log from version control",
                                    log_path(), number, run::json_error_text(e)));
    }
  }
  return entries;
}

namespace {
// `file` (named `path` in messages), lane `lane` of `store`: its content hash must be the
// one the store's log last recorded for the lane.
void check_recorded_hash(const GoldenStore& store, const fs::path& file, const std::string& path,
                         const std::string& lane, const std::map<std::string, std::string>& recorded) {
  if (!fs::is_regular_file(file)) {  // a directory has no content to hash: never a golden
    throw GoldenError(fmt::format("{}: is not a file, where the golden of lane {} belongs; restore it with "
                                  "`git checkout -- {}`",
                                  path, lane, path));
  }
  const auto it = recorded.find(lane);
  const std::string hash = run::file_content_hash(file.string());
  const std::string restore = fmt::format(
      "restore it with `git checkout -- {}`, or re-approve it: `harness golden refresh --lanes {} --reason TEXT`, "
      "then `harness golden approve`",
      path, lane);
  if (it == recorded.end()) {
    throw GoldenError(fmt::format("{}: a golden that {} never recorded (content {}); {}", path, store.log_path(), hash,
                                  restore));
  }
  if (it->second != hash) {
    throw GoldenError(fmt::format("{}: changed outside `harness golden approve` (content {}, the log last recorded {}); {}",
                                  path, hash, it->second, restore));
  }
}

// The lane of `file` under `dir` ("micro/cpu-ref" for dir/micro/cpu-ref.h5), or "" when it is no .h5 file.
std::string lane_below(const fs::path& dir, const fs::path& file) {
  std::string lane = fs::relative(file, dir).string();
  if (!ends_with(lane, ".h5")) return "";
  lane.resize(lane.size() - 3);
  return lane;
}
}  // namespace

void verify_golden_integrity(const std::string& path) {
  const fs::path file = fs::weakly_canonical(fs::path(path));
  if (ends_with(file.string(), kCandidateSuffix)) return;  // candidates are reviewed, not trusted
  // goldens/<canary>/<lane>.h5 (lanes may hold one more level): the log is up to three levels up.
  fs::path dir = file.parent_path();
  for (int level = 0; level < 3 && !dir.empty(); ++level, dir = dir.parent_path()) {
    const GoldenStore store(dir.string());
    if (!fs::exists(store.log_path())) continue;
    const std::string lane = lane_below(dir, file);
    if (lane.empty()) return;
    const std::map<std::string, std::string> recorded = last_recorded(store.log());
    // A log governs only the canaries it has recorded: a stray provenance.jsonl in a parent
    // (a temp dir, a home directory) does not turn every receipt below it into a golden.
    if (!records_canary(recorded, lane)) continue;
    check_recorded_hash(store, file, path, lane, recorded);
    return;
  }
}

void verify_golden_integrity(const std::string& path, const GoldenStore& store) {
  // Named as the goldens directory (check --goldens, the nightly): its log, where it has
  // one, governs every golden in it, whatever it has recorded: an emptied log is no
  // licence. A directory without a log holds receipts put there by hand, not goldens.
  if (!fs::exists(store.log_path())) return;
  const fs::path file = fs::weakly_canonical(fs::path(path));
  const std::string lane = lane_below(fs::weakly_canonical(fs::path(store.directory())), file);
  if (lane.empty()) return;
  check_recorded_hash(store, file, path, lane, last_recorded(store.log()));
}

std::optional<std::int64_t> receipt_schema_version(const std::string& path) {
  try {
    const h5::Handle file = h5::open_file(path, false);
    const h5::Handle manifest = h5::open_group(file, "manifest");
    if (!h5::has_attr(manifest, "schema_version")) return std::nullopt;
    return h5::read_attr_int(manifest, "schema_version");
  } catch (const h5::Hdf5Error&) {
    return std::nullopt;
  }
}

}  // namespace harness::nightly
