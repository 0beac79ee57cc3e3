// The goldens directory: goldens/<canary>/<engine and features>.h5, one per lane of the
// matrix, candidates beside them (<lane>.candidate.h5) until approved or rejected, and an
// append-only provenance log. docs/goldens.md is the reference.
//
// A golden is only ever written by promote(): the reviewed candidate is renamed over it
// (atomic on POSIX) and the log is replaced by a complete new copy (temporary file and
// rename), so a reader sees the old golden or the new one, never a partial file.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "file_io.h"
#include "matrix.h"

namespace harness::nightly {

// A problem with the goldens directory or a candidate: the message names the file.
struct GoldenError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where a candidate came from: `golden refresh` ran its lane of the matrix, or took a
// receipt made elsewhere (`golden refresh --receipt`: a Python canary, another host).
inline constexpr const char* kSourceLane = "lane";
inline constexpr const char* kSourceReceipt = "receipt";

// One line of goldens/provenance.jsonl: who promoted what, why, and what it changed.
struct ProvenanceEntry {
  std::string date_utc, lane, old_hash, new_hash, reason, approver, git_commit, toolchain;
  nlohmann::json comparison;  // the candidate against the golden it replaced, at refresh
  bool allow_dirty = false;   // approved although built from a tree with uncommitted changes
  std::string source = kSourceLane;  // kSourceLane: refreshed by running a lane; kSourceReceipt: a receipt made elsewhere
  nlohmann::json to_json() const;
};

// A candidate written by refresh and waiting for review.
struct Candidate {
  std::string id, lane, content_hash, reason, refreshed_utc;
  nlohmann::json comparison;  // {"verdict": pass|fail|new|incomparable, "summary": ..., ...}
  std::string source = kSourceLane;
  // A Python canary's: the aten traces refresh stored in it, or why there are none ("" for others).
  std::string aten_trace;
};

// One lane's golden as `golden status` sees it.
struct GoldenState {
  std::string id, lane, path;
  std::string state;  // ok, missing, old-schema, unrecorded, unreadable
  std::string detail;
  std::string content_hash;
  bool candidate_pending = false;
};

struct GoldenStatus {
  std::vector<GoldenState> lanes;
  std::vector<std::string> orphans;  // goldens of no lane in the matrix (paths)
  std::vector<std::string> orphaned_candidates;
  bool clean() const;
  nlohmann::json to_json() const;
};

class GoldenStore {
 public:
  explicit GoldenStore(std::string directory);

  const std::string& directory() const { return dir_; }
  std::string golden_path(const std::string& lane) const;
  std::string candidate_path(const std::string& lane) const;
  std::string log_path() const;
  std::string review_path() const;

  // The matrix's lanes, then every lane whose golden was last approved from a receipt.
  GoldenStatus status(const Matrix& matrix) const;

  // Pending candidates (goldens/candidates.json), by lane.
  std::vector<Candidate> candidates() const;
  // Records a candidate already written to candidate_path(lane); rewrites the review report.
  void add_candidate(const Candidate& candidate);
  // Drops a candidate's file and record.
  void drop_candidate(const std::string& lane);
  // Throws GoldenError unless the candidate is the file that was reviewed (same content
  // hash), a receipt that validates, complete, of the candidate's lane.
  void verify(const Candidate& candidate) const;
  // Promotes a verified candidate: renames it over the golden and appends a provenance
  // entry to the log. Throws GoldenError and changes nothing when verify() would.
  void promote(const Candidate& candidate, const std::string& approver, bool allow_dirty = false);
  // Throws GoldenError unless the candidate was built from a clean tree (its manifest's
  // git_commit has no "-dirty"), or allow_dirty is given (then the log records it).
  void verify_clean_build(const Candidate& candidate, bool allow_dirty) const;

  std::vector<ProvenanceEntry> log() const;

 private:
  void write_candidates(const std::vector<Candidate>& candidates) const;
  void write_review(const std::vector<Candidate>& candidates) const;
  void check_bookkeeping() const;
  std::string candidates_path() const;

  std::string dir_;
};

// Before a golden is used (check, nightly, bisect): when `path` lies in a goldens directory
// (a provenance.jsonl up to three levels above it has recorded lanes of its canary, the
// first path component below the log), its content hash must be the one the log last
// recorded for it. Throws GoldenError naming the file, the hashes and the two ways back:
// restore it from version control, or refresh and approve it. Files outside any goldens
// directory are not goldens and pass.
void verify_golden_integrity(const std::string& path);
// The same for a golden of a goldens directory named as such (check --goldens, the
// nightly's): the store's log, where there is one, governs every golden in it, so a
// golden it never recorded (an emptied log included) is a GoldenError too.
void verify_golden_integrity(const std::string& path, const GoldenStore& store);

// The schema_version a receipt declares, or nullopt when the file is not a receipt.
std::optional<std::int64_t> receipt_schema_version(const std::string& path);

}  // namespace harness::nightly
