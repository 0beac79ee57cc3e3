// The matrix's false-alarm estimate (docs/budgets.md, "False alarms"): how likely one
// nightly is to go red on a change that moved no bit that matters, from the held-out samples
// its entries were calibrated with.
#pragma once

#include <nlohmann/json.hpp>

namespace harness::nightly {

// summary.json's `false_alarm` from its lanes' check verdicts: {bound (any check failing a
// bitwise-irrelevant change, Boole's sum of the checks' bounds, capped at 1; null while a
// check's entries lack held-out samples), confidence, checks (how many judged), measured (how
// many of them have a bound), unmeasured (the entries without held-out samples, sorted),
// entries ({entry: its bound}), summary (one line)}.
nlohmann::json matrix_false_alarm(const nlohmann::json& summary);

}  // namespace harness::nightly
