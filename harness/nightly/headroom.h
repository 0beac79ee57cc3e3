// Fragile lanes and headroom over time (docs/nightly.md, "Fragile lanes and headroom over
// time"): a lane's least headroom over the checks that judged it against a tolerance, the
// lanes that pass with too little of their budget left, and that headroom across the
// previous nightlies' summaries (--history DIR).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness::nightly {

// A pass with less than a fifth of its budget left is fragile (issue 47's threshold): the
// next host, compiler or library moves the last bits by about that much, and the lane goes
// red without a change of its own. The report says so while it is still green.
inline constexpr double kFragileHeadroomPct = 20;

// The least headroom of a lane record (summary.json's lanes[]) over the metrics its checks
// judged against a tolerance: {headroom_pct (null: a NaN or a broken exact budget, below
// any number), check, metric, step (the metric's worst), features (the check's budget
// entries)}. null when nothing was: a bitwise or exact metric that did not move has no
// tolerance to use up, and a check that errored judged nothing.
nlohmann::json least_headroom(const nlohmann::json& lane);

// Sets each lane's `headroom` (least_headroom) and `fragile` (it passed with under
// kFragileHeadroomPct), and the job's `fragile_lanes` (their ids, in lane order).
void mark_fragile_lanes(nlohmann::json& summary);

// When a nightly started: its earliest shard's started_utc (ISO 8601 sorts as text).
std::string summary_started_utc(const nlohmann::json& summary);

// A previous nightly as a point of the history: when it started, each lane's least headroom.
struct PastNightly {
  std::string path, started_utc;
  std::map<std::string, nlohmann::json> headroom_pct;  // lane id -> number, or null
};

// The summary.json of DIR and of each directory in DIR (previous nightlies' --out
// directories), oldest first, skipping out_dir's own. Throws run::UsageError naming the
// directory or the file (not JSON, not a nightly summary) and what to do.
std::vector<PastNightly> read_history(const std::string& dir, const std::string& out_dir);

// {lane id: [{started_utc, headroom_pct}, ...]} per lane of `summary`: the past nightlies
// that ran it, oldest first, then this one.
nlohmann::json headroom_history(const std::vector<PastNightly>& past, const nlohmann::json& summary);

// The history of a merged job: each lane's series from the shard that ran it; null when no
// shard had one.
nlohmann::json merge_histories(const std::vector<nlohmann::json>& shards);

}  // namespace harness::nightly
