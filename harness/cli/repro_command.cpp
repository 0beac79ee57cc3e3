// `harness repro A B --out DIR`: the first op where two runs part, as files a kernel team can
// run without the harness (docs/oracle.md, "A standalone repro"): each side's operands as
// that side's op read them and its results, as .npy (numpy and torch read them), op.json
// (the op, its site and step, each side's precisions and what bisect's oracle said), and
// repro.py, which recomputes the op in float64 and in the diverging side's precision with
// numpy alone and prints each side's distance from float64 and from the other. Two Python
// canaries' runs part at an aten op: the package writes each side's call (its operands, its
// result, call.json) and its own script, which runs the op again with torch
// (python/canary_harness/tracing/op_repro.py). Exit 0 written, 2 nothing to reproduce (the
// runs do not part at an op the oracle judges) or bad input. DIR is made whole or not at
// all.
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bisect.h"
#include "commands.h"
#include "defaults.h"
#include "file_io.h"
#include "golden_store.h"
#include "json_text.h"
#include "python_canary.h"
#include "replay.h"

namespace harness::cli {
namespace {

namespace fs = std::filesystem;

struct ReproFlags {
  std::string a, b, budgets = default_budgets(), out;
  bool force = false;
};

// A float32 array in numpy's .npy format (version 1.0): the magic, a header dict padded with
// spaces to a multiple of 64 bytes and ending in '\n', then the little-endian values.
std::string npy(const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  std::string dims = fmt::format("{}", fmt::join(shape, ", "));
  if (shape.size() == 1) dims += ",";  // (4,): a tuple of one axis
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const std::size_t preamble = 10;  // magic (6), version (2), header length (2)
  header.append(64 - (preamble + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const std::size_t at = out.size();
  out.resize(at + values.size() * sizeof(float));
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));  // x86-64 and aarch64: little-endian
  return out;
}

// repro.py: numpy only, no import of the harness. The float64 reference of each op the oracle
// judges (harness/run/op_oracle.cpp computes the same in C++), each side's recorded result
// against it at every element and at the element bisect's oracle named, and the diverging
// side's op recomputed in its own precision (operands rounded as it declared, fp32 products
// and sums in numpy's order, the result rounded to what it stores).
constexpr const char* kScript = R"py(#!/usr/bin/env python3
"""The first divergent op of two runs, run again with numpy alone (written by `harness repro`).
Prints one JSON object: per side its distance from float64 (at every element and at the one
bisect's oracle named, in ulps of the precision it stores) and from the other side; and the
diverging side's op recomputed in its declared precision."""
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OP = json.load(open(os.path.join(HERE, "op.json")))
FRACTION_BITS = {"fp32": 23, "bf16": 7, "e4m3": 3, "e5m2": 2}
LEAST_NORMAL = {"fp32": -126, "bf16": -126, "e4m3": -6, "e5m2": -14}


def load(side, name):
    return np.load(os.path.join(HERE, side, name + ".npy"))


def ulp(x, precision):
    """The spacing of the precision's grid at |x| (its least spacing below the least normal, at 0 too)."""
    _, exponent = np.frexp(np.abs(x).astype(np.float64))
    binade = np.where(x == 0, LEAST_NORMAL[precision], np.maximum(exponent - 1, LEAST_NORMAL[precision]))
    return np.ldexp(1.0, binade - FRACTION_BITS[precision])


def to_bf16(x):
    """x rounded to bf16 (nearest, ties to even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def rounded(x, precision):
    return to_bf16(x) if precision == "bf16" else np.asarray(x, dtype=np.float32)


def exact(side):
    """The op's results in float64 on this side's own operands."""
    f64 = lambda name: load(side, name).astype(np.float64)
    kind = OP["op"]
    if kind == "linear_forward":
        x, w = f64("inp"), f64("weight")
        out = x.reshape(-1, w.shape[1]) @ w.T
        if os.path.exists(os.path.join(HERE, side, "bias.npy")):
            out = out + f64("bias")
        return {"out": out}
    if kind == "linear_backward":
        dy, x, w = f64("dout"), f64("inp"), f64("weight")
        dy, x = dy.reshape(-1, w.shape[0]), x.reshape(-1, w.shape[1])
        out = {"dinp": f64("dinp").reshape(dy.shape[0], -1) + dy @ w, "dweight": f64("dweight") + dy.T @ x}
        if os.path.exists(os.path.join(HERE, side, "dbias.npy")):
            out["dbias"] = f64("dbias") + dy.sum(axis=0)
        return out
    if kind == "residual_forward":
        return {"out": f64("a") + f64("b")}
    if kind == "residual_backward":
        return {"da": f64("da") + f64("dout"), "db": f64("db") + f64("dout")}
    if kind == "layernorm_forward":  # mean; rstd given the op's own mean; out given its own mean and rstd
        w, b = f64("weight"), f64("bias")
        x = f64("inp").reshape(-1, w.shape[0])
        mean = load(side, "mean.out").astype(np.float64).reshape(-1, 1)
        rstd = load(side, "rstd.out").astype(np.float64).reshape(-1, 1)
        eps = OP["attributes"][0]
        return {"mean": x.mean(axis=1), "rstd": 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=1) + eps),
                "out": (x - mean) * rstd * w + b}
    if kind == "gelu_erf_forward":
        x = f64("inp")
        return {"out": 0.5 * x * np.vectorize(math.erfc)(-x / math.sqrt(2.0))}
    sys.exit(f"repro.py: no float64 reference of {kind}")


def recomputed(side):
    """The op as the side declared it: operands rounded to its products' precision, then
    float32 arithmetic in numpy's order, each result rounded to what it stores."""
    p = OP["sides"][side]["operands"]
    f32 = lambda name: load(side, name).astype(np.float32)
    kind = OP["op"]
    if kind == "linear_forward":
        x, w = rounded(f32("inp"), p), rounded(f32("weight"), p)
        out = x.reshape(-1, w.shape[1]) @ w.T
        if os.path.exists(os.path.join(HERE, side, "bias.npy")):
            out = out + f32("bias")
        return {"out": out}
    if kind == "linear_backward":
        dy, x, w = rounded(f32("dout"), p), rounded(f32("inp"), p), rounded(f32("weight"), p)
        dy, x = dy.reshape(-1, w.shape[0]), x.reshape(-1, w.shape[1])
        out = {"dinp": f32("dinp").reshape(dy.shape[0], -1) + dy @ w, "dweight": f32("dweight") + dy.T @ x}
        if os.path.exists(os.path.join(HERE, side, "dbias.npy")):
            out["dbias"] = f32("dbias") + dy.sum(axis=0, dtype=np.float32)
        return out
    return {name: value.astype(np.float32) for name, value in exact(side).items()}  # elementwise: one rounding


def distance(got, reference, precision):
    got, reference = got.astype(np.float64).reshape(-1), reference.astype(np.float64).reshape(-1)
    error = np.abs(got - reference)
    ulps = error / ulp(reference, precision)
    return {"max_abs": float(error.max()), "max_ulps": float(ulps.max())}


report = {"op": OP["op"], "site": OP["site"], "step": OP["step"], "result": OP["result"], "sides": {}}
for side in ("a", "b"):
    stored = OP["sides"][side]["stored"]
    reference = exact(side)[OP["result"]].reshape(-1)
    got = load(side, OP["result"] + ".out").astype(np.float64).reshape(-1)
    other = load("b" if side == "a" else "a", OP["result"] + ".out").astype(np.float64).reshape(-1)
    at = OP["sides"][side].get("worst_index")
    entry = {"from_float64": distance(got, reference, stored), "from_other_side": distance(got, other, stored)}
    if at is not None:
        entry["error_ulps_at_oracle_element"] = float(abs(got[at] - reference[at]) / ulp(reference[at], stored))
    if OP["sides"][side]["operands"] in ("fp32", "bf16"):
        entry["recomputed_from_float64"] = distance(
            rounded(recomputed(side)[OP["result"]], stored), reference, stored)
    else:  # an FP8 unit's scaled operands ("e4m3,e4m3 scaled"): its quantisation is not recomputed here
        entry["recomputed_from_float64"] = None
    report["sides"][side] = entry
print(json.dumps(report, indent=1, sort_keys=True))
)py";

// Whether the two receipts are Python canaries' (the package writes their op), else both a
// harness engine's; a UsageError for a PyTorch lane's, or one of each.
bool python_canaries(const ReproFlags& f) {
  int python = 0;
  for (const std::string& path : {f.a, f.b}) {
    if (python_receipt_manifest(path)) {
      ++python;
    } else if (is_pack_lane_receipt(path)) {
      throw run::UsageError(fmt::format("{}: a PyTorch lane's receipt, whose steps are judged at module outputs; "
                                        "repro writes one op (bisect's verdict is the lane's: docs/oracle.md)", path));
    }
  }
  if (python == 1) {
    throw run::UsageError(fmt::format("{} and {}: a Python canary's run and a harness engine's; repro writes an op of "
                                      "two runs of one kind", f.a, f.b));
  }
  return python == 2;
}

// What bisect found and what each side's oracle said, or a UsageError saying why there is
// nothing to reproduce.
check::Bisection divergence(const ReproFlags& f) {
  const auto traced = [](const check::ReceiptData& run, int step) { return replayed_trace(run, step); };
  const auto judged = [](const check::ReceiptData& run, int step, const check::DivergentOp& op) {
    return judged_op(run, step, op);
  };
  check::Bisection b = check::bisect(check::load_receipt(f.a), check::load_receipt(f.b), check::load_budgets(f.budgets),
                                     traced, judged);
  if (!b.diverged()) throw run::UsageError(fmt::format("{} and {} do not part: nothing to reproduce", f.a, f.b));
  if (!b.first_divergent_op) throw run::UsageError(fmt::format("no first divergent op ({}): nothing to reproduce", b.no_op));
  if (!b.oracle || !b.oracle->a.judged || !b.oracle->b.judged) {
    throw run::UsageError(fmt::format("{} {}: {}; only an op the oracle judges on both sides can be reproduced",
                                      b.first_divergent_op->name, b.first_divergent_op->phase,
                                      b.oracle ? b.oracle->verdict : "not judged"));
  }
  return b;
}

// Step `step` of `receipt` replayed, its op at `op`'s site and phase kept.
run::CapturedOp captured_op(const std::string& receipt, int step, const check::DivergentOp& op) {
  run::ReplayOptions options = one_step(receipt, step);
  options.oracle_step = step;
  options.capture_site = op.name;
  for (const Phase p : {Phase::Forward, Phase::Backward, Phase::Optimizer}) {
    if (to_string(p) == op.phase) options.capture_phase = p;
  }
  const run::ReplayResult r = run::replay(options);
  if (!r.captured) throw run::UsageError(fmt::format("{}: a replay of step {} did not run {} again", receipt, step, op.name));
  return *r.captured;
}

// The result the traces named: the captured op's result whose tensor bisect saw part.
std::string result_of(const run::CapturedOp& c, const check::DivergentOp& op) {
  for (const run::CapturedOp::Tensor& t : c.results) {
    if (t.tensor == op.tensor) return t.operand;
  }
  throw run::UsageError(fmt::format("{}: the traced output {} is none of the op's results", op.name, op.tensor));
}

// The precision the captured op stores its result `result` in.
std::string stored_precision(const run::CapturedOp& c, const std::string& result) {
  for (std::size_t i = 0; i < c.results.size(); ++i) {
    if (c.results[i].operand == result) return c.stored.at(i);
  }
  throw run::UsageError(fmt::format("{}: the replay captured no result {}", c.site, result));
}

// What op.json says of the first divergent op and of each side's oracle (both kinds of run).
nlohmann::json op_description(const check::Bisection& b) {
  const check::DivergentOp& op = *b.first_divergent_op;
  nlohmann::json description{{"site", op.name}, {"phase", op.phase}, {"step", b.first_divergent_step},
                             {"verdict", b.oracle->verdict}, {"receipts", {b.a_path, b.b_path}}};
  const check::OracleSide* judged[] = {&b.oracle->a, &b.oracle->b};
  for (int s = 0; s < 2; ++s) {
    description["sides"][s == 0 ? "a" : "b"] = {{"stored", judged[s]->stored},
                                                {"worst_index", judged[s]->worst_index},
                                                {"oracle_error_ulps", judged[s]->error_ulps},
                                                {"bound_ulps", judged[s]->bound_ulps},
                                                {"within", judged[s]->within}};
  }
  return description;
}

// DIR's files: each side's operands and results as .npy, op.json, repro.py.
void write_repro(const std::string& dir, const check::Bisection& b, const run::CapturedOp (&sides)[2]) {
  nlohmann::json description = op_description(b);
  description.update({{"op", describe(sides[0].op).name}, {"result", result_of(sides[0], *b.first_divergent_op)},
                      {"attributes", sides[0].attributes}});
  for (int s = 0; s < 2; ++s) {
    const std::string side = s == 0 ? "a" : "b";
    fs::create_directories(fs::path(dir) / side);
    for (const run::CapturedOp::Tensor& t : sides[s].inputs) {
      run::write_file_atomically((fs::path(dir) / side / (t.operand + ".npy")).string(), npy(t.shape, t.values));
    }
    for (const run::CapturedOp::Tensor& t : sides[s].results) {
      run::write_file_atomically((fs::path(dir) / side / (t.operand + ".out.npy")).string(), npy(t.shape, t.values));
    }
    description["sides"][side].update({{"operands", sides[s].operands_precision},
                                       {"stored", stored_precision(sides[s], description["result"])}});
  }
  run::write_file_atomically((fs::path(dir) / "op.json").string(), run::json_text(description) + "\n");
  run::write_file_atomically((fs::path(dir) / "repro.py").string(), kScript);
}

// Side `side`'s call of the op into DIR/side, by the package (capture-ops keeps it whole on
// a replay of the step), and its script at DIR/repro.py with side a's.
void write_python_side(const std::string& dir, const std::string& side, const std::string& receipt, int step,
                       const check::DivergentOp& op) {
  const run::TempDir work("repro", "a Python canary's captured op");
  const nlohmann::json key{{"op", op.name}, {"phase", op.phase}, {"tensor", op.tensor}, {"occurrence", op.occurrence}};
  std::vector<std::string> flags{"--step", std::to_string(step), "--values", work.file("values.h5"), "--level", "aten",
                                 "--operands-of", key.dump(), "--operands-dir", (fs::path(dir) / side).string()};
  if (side == "a") flags.insert(flags.end(), {"--script", (fs::path(dir) / "repro.py").string()});
  const auto manifest = python_receipt_manifest(receipt);
  const run::PythonCommand command = run::python_canary_command("capture-ops", receipt, *manifest, flags);
  const run::PythonJsonResult captured = run::run_python_for_json(command.argv, command.environment);
  if (captured.child.exit_code() == 1) {  // the step replayed otherwise than recorded: its result says where
    const nlohmann::json mismatch = captured.result.is_object() ? captured.result.value("first_mismatch", nlohmann::json())
                                                                : nlohmann::json();
    throw run::UsageError(fmt::format("{}: a replay does not reproduce step {} ({}); its op cannot be written as it ran",
                                      receipt, step, mismatch.is_object() ? mismatch.value("what", "?") : "?"));
  }
  if (!captured.child.exited_zero()) {
    throw run::UsageError(fmt::format("{}: its op could not be written: {}", receipt, run::last_line(captured.child.stderr_tail)));
  }
}

// DIR's files for two Python canaries' runs: each side's call (the package's), op.json, repro.py.
void write_python_repro(const std::string& dir, const check::Bisection& b) {
  const check::DivergentOp& op = *b.first_divergent_op;
  fs::create_directories(dir);
  write_python_side(dir, "a", b.a_path, b.first_divergent_step, op);
  write_python_side(dir, "b", b.b_path, b.first_divergent_step, op);
  nlohmann::json description = op_description(b);
  description.update({{"op", op.tensor}, {"source", op.site}, {"occurrence", op.occurrence}});
  run::write_file_atomically((fs::path(dir) / "op.json").string(), run::json_text(description) + "\n");
}

// --out as a directory path without a trailing separator ("DIR/" is "DIR").
fs::path out_dir(const std::string& out) {
  fs::path p = fs::path(out).lexically_normal();
  return p.filename().empty() ? p.parent_path() : p;
}

// Where DIR is made before it is renamed into place: beside it, never inside it, and never a
// directory of the user's own.
fs::path building_dir(const fs::path& out) {
  const fs::path building = out.parent_path() / (out.filename().string() + ".repro-partial");
  if (fs::exists(building)) {
    throw run::UsageError(fmt::format("--out: {} exists (a repro interrupted while it wrote?); remove it", building.string()));
  }
  return building;
}

// The op's files into `building`: the package's for Python canaries, else each side's op
// captured on a replay. Returns the op's name (its aten overload, or its description's).
std::string write_op(const ReproFlags& f, const fs::path& building, const check::Bisection& b, bool python) {
  const check::DivergentOp& op = *b.first_divergent_op;
  if (python) {
    if (op.level != check::kAtenLevel) {
      throw run::UsageError(fmt::format("{}: the runs part at a module output, not at one op; repro writes an aten op "
                                        "(bisect the runs' aten traces: docs/bisect.md)", op.name));
    }
    write_python_repro(building.string(), b);
    return op.tensor;
  }
  const run::CapturedOp sides[] = {captured_op(f.a, b.first_divergent_step, op), captured_op(f.b, b.first_divergent_step, op)};
  write_repro(building.string(), b, sides);
  return std::string(describe(sides[0].op).name);
}

int run_repro(const ReproFlags& f) {
  const fs::path out = out_dir(f.out);
  if (fs::exists(out) && !f.force) throw run::UsageError(fmt::format("--out: {} exists; give --force to replace it", f.out));
  const fs::path building = building_dir(out);
  nightly::verify_golden_integrity(f.a);  // a missing or damaged receipt is named first
  nightly::verify_golden_integrity(f.b);
  const bool python = python_canaries(f);
  const check::Bisection b = divergence(f);
  std::string name;
  try {
    name = write_op(f, building, b, python);
  } catch (...) {  // nothing half-written is left
    fs::remove_all(building);
    throw;
  }
  fs::remove_all(out);
  fs::rename(building, out);
  const check::DivergentOp& op = *b.first_divergent_op;
  fmt::print("{:<12}{} {} at step {} ({})\n{:<12}{}\n{:<12}python3 {}/repro.py\n", "repro", op.name, op.phase,
             b.first_divergent_step, name, "oracle", b.oracle->verdict, "run", out.string());
  return kExitPass;
}

}  // namespace

void add_repro_command(CLI::App& app, CommandRegistry& commands) {
  auto f = std::make_shared<ReproFlags>();
  CLI::App* repro = app.add_subcommand("repro", "Write the first op where two runs part as files numpy (or torch) runs alone");
  repro->add_option("a", f->a, "Receipt of one run (.h5)")->required();
  repro->add_option("b", f->b, "Receipt of the other (.h5)")->required();
  repro->add_option("--out", f->out, "Directory to write (made whole or not at all)")->required();
  repro->add_option("--budgets", f->budgets, "Budgets file (TOML), as bisect takes it")->capture_default_str();
  repro->add_flag("--force", f->force, "Replace --out when it exists");
  commands.add(repro, [f] { return run_repro(*f); });
}

}  // namespace harness::cli
