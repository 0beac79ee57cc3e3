// The lane matrix: the shipped one is whole, bad files name their key, shards partition
// the lanes; the atomic writer leaves no partial file behind.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "file_io.h"
#include "false_alarms.h"
#include "headroom.h"
#include "reports.h"
#include "resume_gate.h"
#include "matrix.h"
#include "lane_stacks.h"
#include "registry.h"
#include "canary_run.h"
#include "scratch_dir.h"

namespace harness::nightly {
namespace {

const std::string kShippedMatrix = std::string(HARNESS_SOURCE_DIR) + "/canaries/nightly.toml";

constexpr const char* kHeader = "schema_version = 1\ncanary = \"micro\"\nsteps = 4\nseed = 1\nreference = \"ref\"\n";
constexpr const char* kRefLane = "[[lanes]]\nid = \"ref\"\nengine = \"cpu-ref\"\n";

std::string write(const testing::ScratchDir& dir, const std::string& text) {
  const std::string path = dir.path("matrix.toml");
  std::ofstream(path) << text;
  return path;
}

// Each (matrix text, wanted) of `cases` is refused with a MatrixError that holds `wanted`
// and names the file (and, when `one_line`, is one line).
void expect_refused(const testing::ScratchDir& dir, const std::vector<std::pair<std::string, std::string>>& cases,
                    bool one_line) {
  for (const auto& [text, wanted] : cases) {
    try {
      load_matrix(write(dir, text));
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const MatrixError& e) {
      EXPECT_NE(std::string(e.what()).find(wanted), std::string::npos) << e.what() << "\nwanted: " << wanted;
      EXPECT_NE(std::string(e.what()).find("matrix.toml"), std::string::npos) << "the file is not named: " << e.what();
      if (one_line) {
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
      }
    }
  }
}

TEST(Matrix, ShippedMatrixHasTheIssuesLanesAndACpuRefReference) {
  const Matrix m = load_matrix(kShippedMatrix);
  EXPECT_EQ(m.reference, "cpu-ref");
  EXPECT_EQ(m.lane(m.reference).engine, "cpu-ref");
  std::set<std::string> lanes;
  for (const LaneSpec& l : m.lanes) lanes.insert(l.lane);
  for (const char* wanted : {"tiny/cpu-ref", "tiny/accel+bf16", "tiny/accel+bf16+fp8=all", "tiny/tpu-mesh@2x2+tp",
                             "tiny/tpu-mesh@2x2+zero3+bf16", "tiny/torch", "tiny/torch+bf16", "tiny/jax@1x1+dp",
                             "tiny/jax@2x2+tp", "tiny/jax@2x2+zero3+bf16"}) {
    EXPECT_TRUE(lanes.count(wanted)) << wanted;
  }
  for (const LaneSpec& l : m.lanes) {
    if (l.engine == "accel") {
      EXPECT_TRUE(l.settings.options.count("noise-seed")) << l.id << ": goldens replay a pinned seed";
    }
    if (l.engine == "torch") {
      EXPECT_TRUE(l.external()) << l.id;
      const std::string& device = l.settings.options.at("device");  // XLA: its CPU client where there is no TPU
      EXPECT_TRUE(device == "cpu" || device == "xla") << l.id << ": the default nightly needs no GPU";
    }
    if (l.engine == "jax") {  // XLA's CPU client: virtual devices, no accelerator
      EXPECT_TRUE(l.external()) << l.id;
      EXPECT_EQ(l.budget_features.front(), "jax") << l.id;
    }
  }
}

TEST(Matrix, BadFilesNameTheirKey) {
  const testing::ScratchDir dir;
  const std::string header = kHeader, ref = kRefLane;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"canary = \"tiny\"\n", "schema_version: must be 1"},
      {header + "colour = 1\n" + ref, "colour: unknown key"},
      {header, "lanes: missing"},
      {header + ref + "[[lanes]]\nid = \"ref\"\nengine = \"cpu-ref\"\n", "id 'ref' appears twice"},
      {header + ref + "[[lanes]]\nid = \"b\"\nengine = \"cpu-ref\"\n", "lane micro/cpu-ref appears twice"},
      {header + ref + "[[lanes]]\nid = \"a\"\nengine = \"accel\"\nmesh = \"2x2\"\n", "lanes[1] (a): "},
      {header + ref + "[[lanes]]\nid = \"a\"\nengine = \"warp\"\n", "lanes[1] (a): "},
      {header + ref + "[[lanes]]\nid = \"A b\"\nengine = \"accel\"\n", "lanes[1] (A b).id: use lower-case"},
      {header + ref + "[[lanes]]\nid = \"a\"\nengine = \"accel\"\nfeatures = \"bf16,fp8=all\"\ntriage-with = \"x\"\n",
       "'x' is not a lane id"},
      {std::string(kHeader).replace(std::string(kHeader).find("steps = 4"), 9, "steps = 0") + ref, "steps: must be an integer"},
      {std::string(kHeader).replace(std::string(kHeader).find("\"ref\""), 5, "\"zz\"") + ref, "reference: 'zz'"},
      {header + ref + "[[lanes]]\nid = \"a\"\nengine = \"tpu-mesh\"\nmesh = 2.5\n", "lanes[1] (a).mesh: must be a string"},
      {header + "control-fault = \"step=1,op=nope\"\n" + ref, "control-fault: --inject-fault: unknown op 'nope'"},
      {header + "control-fault = \"step=4,op=embedding\"\n" + ref,
       "control-fault: step 4 is past the matrix's 4 steps"},
      {header + "control-fault = 3\n" + ref, "control-fault: must be a non-empty string"},
  };
  expect_refused(dir, cases, false);
}

// triage-with pairs are judged against the budgets: the lane declares a feature whose entry
// declares a twin ([fp8]), and its twin does not declare that feature.
TEST(Matrix, TriagePairsAreCheckedAgainstTheBudgetsDeclarations) {
  const testing::ScratchDir dir;
  const check::Budgets budgets = check::load_budgets(std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml");
  const std::string header = kHeader, ref = kRefLane;
  const std::string bf16 = "[[lanes]]\nid = \"b\"\nengine = \"accel\"\nfeatures = \"bf16\"\n";
  const std::string fp8 = "[[lanes]]\nid = \"f\"\nengine = \"accel\"\nfeatures = \"bf16,fp8=all\"\n";
  const auto error_of = [&](const std::string& text) -> std::string {
    try {
      check_triage_pairs(load_matrix(write(dir, text)), budgets);
    } catch (const MatrixError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error_of(header + ref + bf16 + fp8 + "triage-with = \"b\"\n"), "accepted");
  EXPECT_NE(error_of(header + ref + bf16 + "triage-with = \"ref\"\n")
                .find("lanes (b).triage-with: the lane declares no budget feature triage explains"),
            std::string::npos);
  const std::string other_fp8 = "[[lanes]]\nid = \"g\"\nengine = \"accel\"\nfeatures = \"bf16,fp8=mlp_fc\"\n";
  const std::string both_fp8 = error_of(header + ref + other_fp8 + fp8 + "triage-with = \"g\"\n");
  EXPECT_NE(both_fp8.find("'g' declares fp8 itself; name the bf16-only twin"), std::string::npos) << both_fp8;
}

// The negative control's faults: by default 1 ulp in each of the canary's first three
// forward ops at the middle step (tried in order); a matrix may name its own.
TEST(Matrix, TheControlFaultsDefaultToTheFirstOpsAtTheMiddleStep) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane));
  std::vector<std::string> faults;
  for (const canary::FaultSpec& f : m.control_faults) faults.push_back(f.to_string());
  EXPECT_EQ(faults, (std::vector<std::string>{"step=2,op=embedding,ulps=1", "step=2,op=blocks.0.ln1,ulps=1",
                                              "step=2,op=blocks.0.attn.qkv,ulps=1"}));
  const std::string own_fault = "control-fault = \"step=3,op=blocks.0.attn.qkv,ulps=2\"\n";
  const Matrix own = load_matrix(write(dir, std::string(kHeader) + own_fault + kRefLane));
  ASSERT_EQ(own.control_faults.size(), 1u);
  EXPECT_EQ(own.control_faults.front().to_string(), "step=3,op=blocks.0.attn.qkv,ulps=2");
}

TEST(Matrix, EngineFlagsTakeIntegersAndSwitches) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"m\"\nengine = \"tpu-mesh\"\ngrad-accum = 2\n"
                                              "compile-mode = \"microstep\"\nleak-scalars = true\n"));
  const LaneSpec& mesh = m.lane("m");
  EXPECT_EQ(mesh.settings.options.at("grad-accum"), "2");
  EXPECT_EQ(mesh.settings.options.at("leak-scalars"), "1");
  const run::RunOptions o = m.run_options(mesh, "x.h5");
  EXPECT_EQ(o.canary, "micro");
  EXPECT_EQ(o.steps, 4);
  EXPECT_EQ(o.seed, 1);
}

TEST(Matrix, TorchLanesExpandToThePyTorchLane) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"t\"\nengine = \"torch\"\n"
                                              "[[lanes]]\nid = \"tb\"\nengine = \"torch\"\ndevice = \"cpu\"\n"
                                              "precision = \"bf16\"\nbudget-features = \"torch-bf16\"\n"));
  const LaneSpec& t = m.lane("t");
  EXPECT_TRUE(t.external());
  EXPECT_EQ(t.fault_flag, "--inject-fault");  // its stack's description: the ladder injects through it
  EXPECT_EQ(t.threads_flag, "--threads");     // and the job's thread count
  EXPECT_TRUE(t.takes_regressions());
  EXPECT_TRUE(m.lane("ref").takes_regressions());  // a harness engine's lane, run in-process
  EXPECT_EQ(t.lane, "micro/torch");
  EXPECT_EQ(t.budget_features, std::vector<std::string>{"torch-cpu"});
  const std::vector<std::string> argv = expand_command(t, "p.h5", "o.h5", 4, 1);
  const std::vector<std::string> wanted{"/usr/bin/python3", "-m", "canary_harness.lane", "--pack", "p.h5", "--device",
                                        "cpu", "--precision", "fp32", "--out", "o.h5"};
  EXPECT_EQ(argv, wanted);
  EXPECT_EQ(t.environment.at("PYTHONPATH"), std::string(HARNESS_SOURCE_DIR) + "/python");
  const LaneSpec& tb = m.lane("tb");
  EXPECT_EQ(tb.lane, "micro/torch+bf16");
  EXPECT_EQ(tb.budget_features, std::vector<std::string>{"torch-bf16"});
  EXPECT_FALSE(m.lane("ref").external());
}

// layout = "ddp" | "fsdp": the PyTorch lane on two processes, named +ddp, under torch-ddp
// beside torch-cpu; another layout, or one on a device, is refused naming the key.
TEST(Matrix, TorchLanesTakeALayout) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"d\"\nengine = \"torch\"\nlayout = \"ddp\"\n"));
  const LaneSpec& d = m.lane("d");
  EXPECT_EQ(d.lane, "micro/torch+ddp");
  EXPECT_EQ(d.budget_features, (std::vector<std::string>{"torch-cpu", "torch-ddp"}));
  const std::vector<std::string> wanted{"/usr/bin/python3", "-m", "canary_harness.lane", "--pack", "p.h5", "--device",
                                        "cpu", "--precision", "fp32", "--layout", "ddp", "--out", "o.h5"};
  EXPECT_EQ(expand_command(d, "p.h5", "o.h5", 4, 1), wanted);
  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\nengine = \"torch\"\n";
  expect_refused(dir, {{head + "layout = \"zero\"\n", "lanes[1] (x).layout: 'zero' is not ddp or fsdp"},
                       {head + "layout = \"ddp\"\ndevice = \"xla\"\n", "lanes[1] (x).layout: a layout runs on the CPU"}},
                 true);
}

// python = "PATH" (relative to the matrix file): the lane runs that interpreter's torch and
// is named after its release (probed with `PATH -c "import torch; ..."`), compile = true
// adds --compile and torch-compile.
TEST(Matrix, TorchLanesOfAnotherInterpreterCarryItsRelease) {
  const testing::ScratchDir dir;
  const std::string fake = dir.path("fakepy");
  std::ofstream(fake) << "#!/bin/sh\necho 2.9.0+cu128\n";
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"t2\"\nengine = \"torch\"\npython = \"fakepy\"\n"
                                              "precision = \"bf16\"\ncompile = true\n"));
  const LaneSpec& t2 = m.lane("t2");
  EXPECT_EQ(t2.lane, "micro/torch@2.9+bf16+compile");
  EXPECT_EQ(t2.budget_features, (std::vector<std::string>{"torch-bf16", "torch-compile"}));
  const std::vector<std::string> wanted{fake, "-m", "canary_harness.lane", "--pack", "p.h5", "--device", "cpu",
                                        "--precision", "bf16", "--compile", "--versioned", "--out", "o.h5"};
  EXPECT_EQ(expand_command(t2, "p.h5", "o.h5", 4, 1), wanted);

  std::ofstream(fake) << "#!/bin/sh\necho no torch here >&2\nexit 1\n";
  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\nengine = \"torch\"\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {head + "python = \"fakepy\"\n", "lanes[1] (x).python: " + fake + " cannot import torch (no torch here)"},
      {head + "python = \"missing/python\"\n", "lanes[1] (x).python: '" + dir.path("missing/python") + "' does not exist"},
      {head + "compile = false\n", "lanes[1] (x).compile: a switch is on (true) or absent"},
  };
  expect_refused(dir, cases, true);
}

// A matrix lane's engine picks its stack from the descriptions (lane_stacks.h): every stack
// of built-in canaries is one engine, reached by it, with a runner that makes the lane its
// description says; no two stacks of one kind of canary share an engine.
TEST(Matrix, EachLaneStackIsReachedByItsEngineAndRunsAsDescribed) {
  const testing::ScratchDir dir;
  std::ofstream(dir.path("fakepy")) << "#!/bin/sh\necho 2.9.0+cu128\n";  // an interpreter with torch 2.9
  std::filesystem::permissions(dir.path("fakepy"), std::filesystem::perms::owner_all);
  std::set<std::pair<std::string, std::string>> kinds;
  for (const LaneStack& stack : lane_stacks()) {
    EXPECT_TRUE(kinds.insert({stack.engine, stack.canaries}).second) << stack.id;
    EXPECT_TRUE(stack.canaries == kPackCanaries || stack.canaries == kPythonCanaries) << stack.id;
    if (stack.canaries != kPackCanaries) continue;
    const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"s\"\nengine = \"" +
                                                stack.engine + "\"\npython = \"fakepy\"\n"));
    const LaneSpec& lane = m.lane("s");
    EXPECT_EQ(&find_lane_stack(lane.engine, kPackCanaries)->id, &stack.id);
    ASSERT_TRUE(lane.external()) << stack.id;
    const std::vector<std::string> argv = expand_command(lane, "p.h5", "o.h5", 4, 1);
    ASSERT_GE(argv.size(), 3u);
    EXPECT_EQ(argv[2], stack.module) << stack.id;
    EXPECT_EQ(lane.lane.rfind("micro/" + stack.engine, 0), 0u) << lane.lane;
  }
  EXPECT_EQ(find_lane_stack("cpu-ref", kPackCanaries), nullptr);  // a harness engine's lane
}

// Each key of every pack stack is read as its description says (LaneStack::lane_keys):
// every value of a choice taken ("cuda:N" as cuda:2) and one outside refused naming the key,
// a switch on or refused off, an interpreter that is not there refused, a default filled
// where the lane gives none, a key given where its only_with does not hold refused with its
// reason. A new key, or a value, is held here by its description alone.
TEST(Matrix, EveryLaneKeyIsReadAsItsDescriptionSays) {
  const testing::ScratchDir dir;
  std::ofstream(dir.path("fakepy")) << "#!/bin/sh\necho 2.9.0+cpu\n";  // an interpreter with torch 2.9
  std::filesystem::permissions(dir.path("fakepy"), std::filesystem::perms::owner_all);
  for (const LaneStack& stack : lane_stacks()) {
    if (stack.canaries != kPackCanaries) continue;
    const std::string head = std::string(kHeader) + "python = \"fakepy\"\n" + kRefLane +
                             "[[lanes]]\nid = \"s\"\nengine = \"" + stack.engine + "\"\n";
    const auto option_of = [&](const std::string& lines, const std::string& key) {
      const Matrix m = load_matrix(write(dir, head + lines));  // kept: the options are its lane's
      const auto& options = m.lane("s").settings.options;
      return options.count(key) ? options.at(key) : std::string("(none)");
    };
    for (const LaneKey& k : stack.lane_keys) {
      SCOPED_TRACE(stack.id + "." + k.key);
      std::string with;  // what its only_with asks of the other keys
      for (const auto& [other, wanted] : k.only_with) with += other + " = \"" + wanted + "\"\n";
      const std::string at = "lanes[1] (s)." + k.key + ": ";
      if (!k.default_value.empty()) {
        EXPECT_EQ(option_of("", k.key), k.default_value);
      }
      switch (k.kind) {
        case LaneKeyKind::kChoice:
          for (std::string value : k.values) {
            if (value.size() > 2 && value.substr(value.size() - 2) == ":N") value.replace(value.size() - 1, 1, "2");
            EXPECT_EQ(option_of(with + k.key + " = \"" + value + "\"\n", k.key), value);
          }
          expect_refused(dir, {{head + with + k.key + " = \"nonsense\"\n", at + "'nonsense' is not "}}, true);
          break;
        case LaneKeyKind::kSwitch:
          EXPECT_NE(option_of(with + k.key + " = true\n", k.key), "(none)");
          expect_refused(dir, {{head + with + k.key + " = false\n", at + "a switch is on (true) or absent"}}, true);
          break;
        case LaneKeyKind::kInterpreter:
          expect_refused(dir, {{head + k.key + " = \"nowhere/python\"\n", at + "'" + dir.path("nowhere/python") + "' does not exist"}},
                         true);
          break;
        case LaneKeyKind::kCount:
        case LaneKeyKind::kEngineFlag:
        case LaneKeyKind::kDeclared:  // a Python canary's (cli.python_canary_nightly), tpu-mesh's, the runner's
        case LaneKeyKind::kArgv:
        case LaneKeyKind::kFeatures:
        case LaneKeyKind::kLaneName:
        case LaneKeyKind::kLaneId:
        case LaneKeyKind::kHarnessFeatures: break;  // no stack's: a harness or a command lane's
      }
      for (const auto& condition : k.only_with) {  // another value of that key: refused with the reason
        const std::string &other = condition.first, &wanted = condition.second;  // (Clang 14 captures no binding)
        const LaneKey* described = find_lane_key(stack, other);
        ASSERT_NE(described, nullptr) << other;
        const auto elsewhere = std::find_if(described->values.begin(), described->values.end(),
                                            [&](const std::string& v) { return v != wanted && v.find(':') == std::string::npos; });
        ASSERT_NE(elsewhere, described->values.end());
        const std::string value = k.kind == LaneKeyKind::kSwitch ? "true" : "\"" + k.values.front() + "\"";
        expect_refused(dir, {{head + other + " = \"" + *elsewhere + "\"\n" + k.key + " = " + value + "\n",
                              at + k.only_with_why + "; drop " + other + " or " + k.key}},
                       true);
      }
    }
  }
}

// The lanes that run no stack are described too (lane_stacks_json: harness_lanes,
// command_lanes): a lane of each harness engine is named and declares what its description's
// example says, and a command lane takes its described keys and no other, the required ones
// refused missing with what they mean.
TEST(Matrix, HarnessAndCommandLanesAreWhatTheirDescriptionsSay) {
  const testing::ScratchDir dir;
  const nlohmann::json described = lane_stacks_json();
  for (const nlohmann::json& engine : described["harness_lanes"]["engines"]) {
    const std::string name = engine["engine"];
    SCOPED_TRACE(name);
    const Matrix m = load_matrix(write(dir, std::string(kHeader) + "[[lanes]]\nid = \"ref\"\nengine = \"" + name + "\"\n"));
    const std::string example = engine["example"]["lane"];
    EXPECT_EQ(m.lane("ref").lane, "micro" + example.substr(example.find('/')));
    EXPECT_EQ(m.lane("ref").budget_features, engine["example"]["budget_features"].get<std::vector<std::string>>());
    for (const nlohmann::json& key : engine["lane_keys"]) EXPECT_NE(find_engine_flag(key["key"].get<std::string>()), nullptr);
  }
  EXPECT_EQ(described["harness_lanes"]["engines"].size(), engine_names().size());
  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\ncommand = [\"tool\", \"{out}\"]\n";
  std::vector<std::pair<std::string, std::string>> cases{
      {head + "budget-features = \"a\"\nbias-repeats = 5\n",
       "lanes[1] (x).bias-repeats: unknown key of a command lane (allowed: id, engine, why, " +
           fmt::format("{}", fmt::join(lane_key_names(command_lane_keys()), ", ")) + ")"}};
  for (const LaneKey& key : command_lane_keys()) {
    if (key.required && key.key != "command") {  // a lane without its command is no command lane
      cases.push_back({head, "lanes[1] (x)." + key.key + ": missing; a command lane names " + key.what});
    }
  }
  ASSERT_GE(cases.size(), 2u);
  expect_refused(dir, cases, true);
}

// engine = "jax": canary_harness.jax on the job's pack, under the interpreter named by
// python (relative to the matrix file), named and judged as that module names its run.
TEST(Matrix, JaxLanesExpandToTheJaxModule) {
  const testing::ScratchDir dir;
  const std::string py = dir.path("venvpy");
  std::ofstream(py) << "#!/bin/sh\nexit 0\n";
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"j\"\nengine = \"jax\"\npython = \"venvpy\"\n"
                                              "[[lanes]]\nid = \"jt\"\nengine = \"jax\"\npython = \"venvpy\"\nmesh = \"2x2\"\n"
                                              "shard-plan = \"zero3\"\nprecision = \"bf16\"\n"));
  const LaneSpec& j = m.lane("j");
  EXPECT_TRUE(j.external());
  EXPECT_TRUE(j.uses_pack());
  EXPECT_EQ(j.lane, "micro/jax@1x1+dp");
  EXPECT_EQ(j.budget_features, std::vector<std::string>{"jax"});
  const std::vector<std::string> wanted{py, "-m", "canary_harness.jax", "--pack", "p.h5", "--mesh", "1x1", "--shard-plan",
                                        "dp", "--precision", "fp32", "--out", "o.h5"};
  EXPECT_EQ(expand_command(j, "p.h5", "o.h5", 4, 1), wanted);
  EXPECT_EQ(j.environment.at("PYTHONPATH"), std::string(HARNESS_SOURCE_DIR) + "/python");
  const LaneSpec& jt = m.lane("jt");
  EXPECT_EQ(jt.lane, "micro/jax@2x2+zero3+bf16");
  EXPECT_EQ(jt.budget_features, (std::vector<std::string>{"jax", "jax-bf16", "mesh-bf16"}));

  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\nengine = \"jax\"\n";
  const std::string venv = "python = \"venvpy\"\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {head, "lanes[1] (x).python: missing; a jax lane names the interpreter"},
      {head + "python = \"nowhere/python\"\n", "lanes[1] (x).python: '" + dir.path("nowhere/python") + "' does not exist"},
      {head + venv + "mesh = \"2by2\"\n", "lanes[1] (x): --mesh: '2by2' is not DxM"},
      {head + venv + "mesh = \"0x4\"\n", "lanes[1] (x): --mesh: '0x4' is not DxM"},
      {head + venv + "shard-plan = \"fsdp\"\n", "lanes[1] (x).shard-plan: 'fsdp' is not dp, tp or zero3"},
      // tpu-mesh's expert plan, which the JAX module does not run: refused here, not when the lane runs
      {head + venv + "shard-plan = \"ep\"\n", "lanes[1] (x).shard-plan: 'ep' is not dp, tp or zero3"},
      {head + venv + "precision = \"fp8\"\n", "lanes[1] (x).precision: 'fp8' is not fp32 or bf16"},
      {head + venv + "device = \"xla\"\n", "lanes[1] (x).device: unknown key of a jax lane"},
      {head + venv + "features = \"bf16\"\n", "lanes[1] (x).features: a jax lane takes no harness features"},
      {head + venv + "budget-features = \"jax\"\n", "lanes[1] (x).budget-features: unknown key of a jax lane"},
  };
  expect_refused(dir, cases, true);
}

// resume-at = K (docs/nightly.md, "The restart gate"): a step the run goes on after, on a
// lane that can stop and go on; anything else is refused before anything runs.
TEST(Matrix, ResumeAtIsAStepTheLaneGoesOnAfter) {
  const testing::ScratchDir dir;
  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\n";
  const Matrix m = load_matrix(write(dir, head + "engine = \"accel\"\nfeatures = \"bf16\"\nresume-at = 2\n"));
  EXPECT_EQ(m.lane("x").resume_at, 2);
  EXPECT_EQ(m.lane("ref").resume_at, -1);
  EXPECT_EQ(load_matrix(write(dir, head + "engine = \"tpu-mesh\"\nresume-at = 0\n")).lane("x").resume_at, 0);
  const std::string range = "must be an integer in 0..2, the last step before the stop";
  const std::vector<std::pair<std::string, std::string>> cases{
      {head + "engine = \"tpu-mesh\"\nresume-at = 3\n", "lanes[1] (x).resume-at: " + range},
      {head + "engine = \"tpu-mesh\"\nresume-at = -1\n", "lanes[1] (x).resume-at: " + range},
      {head + "engine = \"tpu-mesh\"\nresume-at = \"2\"\n", "lanes[1] (x).resume-at: " + range},
      {head + "engine = \"accel\"\nnoise = \"racy\"\nresume-at = 1\n",
       "lanes[1] (x).resume-at: its reductions are racy, so no run repeats it; drop resume-at"},
      {head + "command = [\"tool\", \"{out}\"]\nbudget-features = \"a\"\nresume-at = 1\n",
       "lanes[1] (x).resume-at: unknown key of a command lane"},
  };
  expect_refused(dir, cases, true);
}

// The gate holds the lane's run again (with its checkpoint) to the job's run before it
// restarts anything: a job's run that the lane does not repeat fails at its first step that
// differs, and no replay is started (tests/cli/resume_gate.sh runs the gates that pass).
TEST(ResumeGate, ARunTheLaneDoesNotRepeatFailsAtItsFirstDifferingStep) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + "[[lanes]]\nid = \"ref\"\nengine = \"cpu-ref\"\nresume-at = 1\n"));
  const LaneSpec& spec = m.lane("ref");
  run::RunOptions o = m.run_options(spec, dir.path("job.h5"));
  run::run_canary(o);
  check::ReceiptData job = check::load_receipt(dir.path("job.h5"));
  job.loss[2] = std::nextafter(job.loss[2], 1e9);  // the job's record of step 2 is not what the lane computes
  const nlohmann::json gate = resume_check({m, spec, job, dir.path("resume"), 1});
  EXPECT_EQ(gate["status"], "fail") << gate.dump();
  EXPECT_EQ(gate["first_difference"]["step"], 2) << gate.dump();
  EXPECT_EQ(gate["at"], 1);
  EXPECT_NE(gate["summary"].get<std::string>().find("step 2 differs"), std::string::npos) << gate.dump();
  EXPECT_EQ(gate["first_difference"]["what"], "the lane's run again, checkpointing: loss") << gate.dump();
  EXPECT_FALSE(gate.contains("command")) << "a replay was started: " << gate.dump();
  EXPECT_TRUE(std::filesystem::exists(dir.path("resume/ref.h5.ckpt/step_000002.h5")));  // checkpointed at K+1
}

TEST(Matrix, CommandLanesFillTheirPlaceholders) {
  const testing::ScratchDir dir;
  const Matrix m = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                              "[[lanes]]\nid = \"c\"\ncommand = [\"run-it\", \"--pack={pack}\", \"{out}\", "
                                              "\"{steps}\", \"s{seed}\"]\nbudget-features = \"torch-cpu+torch-host\"\n"));
  const LaneSpec& c = m.lane("c");
  EXPECT_EQ(c.engine, "command");
  EXPECT_EQ(c.lane, "micro/c");
  EXPECT_EQ(c.budget_features, (std::vector<std::string>{"torch-cpu", "torch-host"}));
  EXPECT_EQ(expand_command(c, "P", "O", 4, 1), (std::vector<std::string>{"run-it", "--pack=P", "O", "4", "s1"}));
  EXPECT_FALSE(c.takes_regressions()) << "a team's command takes what it takes: no fault flag is assumed";
  const Matrix named = load_matrix(write(dir, std::string(kHeader) + kRefLane +
                                                  "[[lanes]]\nid = \"c\"\ncommand = [\"x\", \"{out}\"]\n"
                                                  "budget-features = \"torch-cpu\"\nlane = \"micro/mine\"\n"));
  EXPECT_EQ(named.lane("c").lane, "micro/mine");
}

TEST(Matrix, BadExternalLanesNameFileAndKey) {
  const testing::ScratchDir dir;
  const std::string head = std::string(kHeader) + kRefLane + "[[lanes]]\nid = \"x\"\n";
  const std::string cmd = "command = [\"tool\", \"{out}\"]\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {head + cmd, "lanes[1] (x).budget-features: missing"},
      {head + cmd + "budget-features = \"\"\n", "lanes[1] (x).budget-features: must be a non-empty string"},
      {head + cmd + "budget-features = \"a++b\"\n", "lanes[1] (x).budget-features: 'a++b' has an empty feature name (item 2)"},
      {head + cmd + "budget-features = \"a+a\"\n", "lanes[1] (x).budget-features: 'a+a' names feature 'a' twice"},
      {head + "command = []\nbudget-features = \"a\"\n", "lanes[1] (x).command: must be a non-empty array"},
      {head + "command = \"tool {out}\"\nbudget-features = \"a\"\n", "lanes[1] (x).command: must be a non-empty array"},
      {head + "command = [\"tool\", 3]\nbudget-features = \"a\"\n", "lanes[1] (x).command[1]: must be a non-empty string"},
      {head + "command = [\"tool\", \"{out}\", \"{dir}\"]\nbudget-features = \"a\"\n",
       "lanes[1] (x).command[2]: '{dir}' is not a placeholder"},
      {head + "command = [\"tool\", \"{pack}\"]\nbudget-features = \"a\"\n", "lanes[1] (x).command: no argument holds {out}"},
      {head + cmd + "budget-features = \"a\"\nengine = \"accel\"\n", "lanes[1] (x).engine: a command lane names no engine"},
      {head + cmd + "budget-features = \"a\"\nmesh = \"2x2\"\n", "lanes[1] (x).mesh: unknown key of a command lane"},
      {head + cmd + "budget-features = \"a\"\nlane = \"tiny/other\"\n", "lanes[1] (x).lane: 'tiny/other' must be micro/NAME"},
      {head + cmd + "budget-features = \"a\"\nfeatures = \"bf16\"\n", "lanes[1] (x).features: an external lane"},
      {head + "engine = \"torch\"\nprecision = \"fp16\"\n", "lanes[1] (x).precision: 'fp16' is not fp32 or bf16"},
      {head + "engine = \"torch\"\ndevice = \"tpu\"\n", "lanes[1] (x).device: 'tpu' is not cpu"},
      {head + "engine = \"torch\"\nnoise-seed = 3\n", "lanes[1] (x).noise-seed: unknown key of a torch-pack lane"},
      {head + "engine = \"torch\"\nbudget-features = \"torch-bf16\"\n", "lanes[1] (x).budget-features: the torch lane"},
      {head + "engine = \"torch\"\n" + cmd, "lanes[1] (x).command: a torch lane's command"},
      {head + "engine = \"accel\"\nbudget-features = \"a\"\n", "lanes[1] (x).budget-features: only an external lane"},
      {head + "engine = \"cpu-ref\"\n" + cmd, "lanes[1] (x).engine: a command lane names no engine"},
  };
  expect_refused(dir, cases, true);
}

// Property: for every shard count, the shards partition the lanes in matrix order.
TEST(Matrix, ShardsPartitionTheLanes) {
  const Matrix m = load_matrix(kShippedMatrix);
  for (int count = 1; count <= 10; ++count) {
    std::vector<const LaneSpec*> seen;
    for (int index = 0; index < count; ++index) {
      const Shard shard = parse_shard(std::to_string(index) + "/" + std::to_string(count));
      for (const LaneSpec* l : shard_lanes(m, shard)) seen.push_back(l);
    }
    ASSERT_EQ(seen.size(), m.lanes.size()) << count << " shards";
    std::set<const LaneSpec*> unique(seen.begin(), seen.end());
    EXPECT_EQ(unique.size(), m.lanes.size()) << count << " shards: a lane in two shards";
  }
  for (const char* bad : {"2/2", "-1/2", "0/0", "1", "a/b", "0/2x", ""}) EXPECT_THROW(parse_shard(bad), MatrixError) << bad;
}

TEST(Matrix, LanesAreSelectedByIdOrName) {
  const Matrix m = load_matrix(kShippedMatrix);
  const auto chosen = select_lanes(m, "cpu-ref,tiny/tpu-mesh@2x2+tp,cpu-ref");
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0]->id, "cpu-ref");
  EXPECT_EQ(chosen[1]->lane, "tiny/tpu-mesh@2x2+tp");
  EXPECT_EQ(select_lanes(m, "").size(), m.lanes.size());
  EXPECT_THROW(select_lanes(m, "cpu-ref,nope"), MatrixError);
}

TEST(FileIo, AtomicWriteLeavesNoPartialFile) {
  const testing::ScratchDir dir;
  const std::string path = dir.path("report.txt");
  using run::file_content_hash, run::read_file, run::write_file_atomically, run::FileError;
  write_file_atomically(path, "first");
  write_file_atomically(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_THROW(write_file_atomically(dir.path("no/such/dir/x"), "x"), FileError);
  EXPECT_EQ(file_content_hash(path), file_content_hash(path));
  write_file_atomically(dir.path("other.txt"), "second, longes!");
  EXPECT_NE(file_content_hash(path), file_content_hash(dir.path("other.txt")));
}

// A summary whose messages carry markup: every report keeps its structure.
TEST(Reports, MessagesCannotBreakTheirReport) {
  const std::string nasty = "a | b\n<script>alert(1)</script> ``` & \"q\"";
  const nlohmann::json check = {{"check", "golden"}, {"status", "fail"}, {"summary", nasty}, {"text", nasty}};
  const nlohmann::json lane = {{"id", "x"}, {"lane", "micro/cpu-ref"}, {"status", "fail"}, {"seconds", 1.0},
                               {"checks", nlohmann::json::array({check})}, {"series", nlohmann::json::object()},
                               {"triage", nasty}, {"why", nasty}};
  const nlohmann::json summary = {{"verdict", "fail"}, {"goldens", "g"},
                                  {"matrix", {{"canary", "micro"}, {"steps", 3}, {"path", "m"}, {"reference", "x"}}},
                                  {"budgets", {{"path", "b"}}}, {"shards", nlohmann::json::array({{{"seconds", 1.0}}})},
                                  {"lanes", nlohmann::json::array({lane})}};
  const std::string md = markdown_report(summary);
  std::size_t rows = 0;
  for (std::size_t at = md.find("\n| `"); at != std::string::npos; at = md.find("\n| `", at + 1)) ++rows;
  EXPECT_EQ(rows, 1u) << md;
  const std::string table = md.substr(0, md.find("<details>"));  // code blocks below may quote anything
  EXPECT_EQ(table.find("<script>"), std::string::npos) << md;
  EXPECT_NE(md.find("BF16-first triage: a \\| b &lt;script>"), std::string::npos) << md;
  EXPECT_NE(md.find("````\n"), std::string::npos) << "the fence must outrun the text's ```:\n" << md;
  const std::string html = html_report(summary);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  const std::string junit = junit_report(summary);
  EXPECT_EQ(junit.find("<script>"), std::string::npos);
  EXPECT_NE(junit.find("failures=\"1\""), std::string::npos) << junit;
}


// A verdict metric as summary.json records it: `allowed` at every one of 3 steps.
nlohmann::json metric(const std::string& name, nlohmann::json headroom, double deviation, double allowed, int worst = 1) {
  return {{"metric", name}, {"judged", true}, {"headroom_pct", headroom}, {"max_deviation", deviation},
          {"worst_step", worst}, {"step_allowed", {allowed, allowed, allowed}}};
}

nlohmann::json judged_check(const std::string& name, const std::vector<nlohmann::json>& metrics,
                            const std::vector<std::string>& features, const std::string& status = "pass") {
  return {{"check", name}, {"status", status},
          {"verdict", {{"budget", {{"features", features}}}, {"metrics", metrics}}}};
}

nlohmann::json lane_of(const std::string& id, const std::string& status, const std::vector<nlohmann::json>& checks) {
  return {{"id", id}, {"status", status}, {"checks", checks}};
}

// Only metrics judged against a tolerance count: a bitwise golden check and an exact metric
// that did not move have none to use up; a broken exact budget (null) is below any number.
TEST(Headroom, LeastOverTheChecksJudgedAgainstATolerance) {
  const nlohmann::json bitwise = judged_check("golden", {metric("loss", 100.0, 0, 0), metric("params", 100.0, 0, 0)}, {"reference"});
  const nlohmann::json reference = judged_check(
      "reference",
      {metric("loss", 40.0, 1e-6, 2e-6), metric("grad_norm", 12.5, 1e-6, 1e-6, 7), metric("compiles", 100.0, 0, 0),
       {{"metric", "logit_kl"}, {"judged", false}, {"headroom_pct", 0.0}, {"max_deviation", 1.0}}},
      {"noise", "bf16"});
  const nlohmann::json least = least_headroom(lane_of("bf16", "pass", {bitwise, reference}));
  EXPECT_EQ(least, nlohmann::json({{"headroom_pct", 12.5}, {"check", "reference"}, {"metric", "grad_norm"}, {"step", 7},
                                   {"features", {"noise", "bf16"}}}));
  EXPECT_TRUE(least_headroom(lane_of("ref", "pass", {bitwise})).is_null());
  const nlohmann::json error = {{"check", "reference"}, {"status", "error"}, {"error", {{"kind", "x"}}}};
  EXPECT_TRUE(least_headroom(lane_of("ref", "error", {bitwise, error})).is_null());
  const nlohmann::json broken = judged_check("golden", {metric("loss", nullptr, 1e-9, 0)}, {"reference"}, "fail");
  EXPECT_TRUE(least_headroom(lane_of("tp", "fail", {broken, reference}))["headroom_pct"].is_null());
  EXPECT_EQ(least_headroom(lane_of("tp", "fail", {broken, reference}))["check"], "golden");
}

// Fragile: a pass under 20% headroom; a failure under it is a failure, not fragile.
TEST(Headroom, FragileLanesPassUnderAFifthOfTheirBudget) {
  const auto with = [](double headroom) {
    return judged_check("reference", {metric("loss", headroom, 1, 2)}, {"noise"});
  };
  nlohmann::json summary = {{"lanes",
                             {lane_of("a", "pass", {with(19.9)}), lane_of("b", "pass", {with(20.0)}),
                              lane_of("c", "fail", {with(-50.0)}), lane_of("d", "pass", {})}}};
  mark_fragile_lanes(summary);
  EXPECT_EQ(summary["fragile_lanes"], nlohmann::json({"a"}));
  std::vector<bool> fragile;
  for (const auto& lane : summary["lanes"]) fragile.push_back(lane["fragile"]);
  EXPECT_EQ(fragile, std::vector<bool>({true, false, false, false}));
  EXPECT_TRUE(summary["lanes"][3]["headroom"].is_null());
}

// The matrix's false-alarm bound: the sum of its checks' (Boole), a bitwise check's 0; none
// while a check's entry has no held-out samples, naming it; an error judged nothing.
TEST(FalseAlarms, TheMatrixBoundIsTheSumOfItsChecksOrNoneWhileOneIsUnmeasured) {
  // Objects and arrays spelled out: Clang reads a one-element brace list ({{"lanes", ...}})
  // as that element, where GCC reads an object or an array of it (the sanitizer build is Clang's).
  const auto check = [](const nlohmann::json& samples, const nlohmann::json& entries, const nlohmann::json& bound) {
    using object = nlohmann::json;
    const object false_alarm = object::object({{"entries", entries}, {"bound", bound}});
    const object budget = object::object({{"samples", samples}, {"false_alarm", false_alarm}});
    return object::object({{"check", "reference"}, {"status", "pass"}, {"verdict", object::object({{"budget", budget}})}});
  };
  const nlohmann::json bitwise = check(nlohmann::json::object(), nlohmann::json::object(), 0.0);
  const nlohmann::json noise = check({{"noise", 8}}, {{"noise", 0.171}}, 0.171);
  const nlohmann::json bf16 = check({{"bf16", 8}, {"noise", 8}}, {{"bf16", 0.1}, {"noise", 0.171}}, 0.271);
  const nlohmann::json error = {{"check", "reference"}, {"status", "error"}, {"error", {{"kind", "x"}}}};
  nlohmann::json summary = nlohmann::json::object(
      {{"lanes", {lane_of("ref", "pass", {bitwise}), lane_of("a", "pass", {noise, error}), lane_of("b", "pass", {bf16})}}});
  const nlohmann::json measured = matrix_false_alarm(summary);
  EXPECT_EQ(measured["checks"], 3);
  EXPECT_EQ(measured["measured"], 3);
  EXPECT_NEAR(measured["bound"].get<double>(), 0.171 + 0.271, 1e-15);
  EXPECT_EQ(measured["unmeasured"], nlohmann::json::array());
  summary["lanes"].push_back(lane_of("c", "pass", {check({{"fp8", 3}, {"bf16", 8}}, {{"bf16", 0.1}}, nullptr)}));
  const nlohmann::json partial = matrix_false_alarm(summary);
  EXPECT_TRUE(partial["bound"].is_null());
  EXPECT_EQ(partial["unmeasured"], nlohmann::json::array({"fp8"}));
  EXPECT_NE(partial["summary"].get<std::string>().find("1 of 4 checks are judged by entries without held-out samples (fp8)"),
            std::string::npos) << partial["summary"];
  summary["lanes"] = nlohmann::json::array({lane_of("a", "pass", {noise, noise, noise, noise, noise, noise, noise})});
  EXPECT_EQ(matrix_false_alarm(summary)["bound"], 1.0);  // capped: a probability
}

// --history: oldest first by start time (not by name), the job's own --out skipped, this
// nightly last; a file that is not a summary is refused naming it, in one line.
TEST(Headroom, HistoryIsOrderedByStartTime) {
  const testing::ScratchDir dir;
  const auto write_summary = [&](const std::string& name, const std::string& started, double headroom) {
    std::filesystem::create_directories(dir.path(name));
    nlohmann::json s = {{"kind", "nightly"}, {"shards", {{{"started_utc", started}}}},
                        {"lanes", {lane_of("tp", "pass", {judged_check("reference", {metric("loss", headroom, 1, 2)}, {"noise"})})}}};
    std::ofstream(dir.path(name + "/summary.json")) << s.dump();
  };
  write_summary("a", "2026-11-02T00:00:00Z", 30);
  write_summary("b", "2026-11-01T00:00:00Z", 50);
  write_summary("now", "2026-11-03T00:00:00Z", 0);  // this job's own --out
  const std::vector<PastNightly> past = read_history(dir.path(""), dir.path("now"));
  ASSERT_EQ(past.size(), 2u);
  EXPECT_EQ(past[0].started_utc, "2026-11-01T00:00:00Z");
  nlohmann::json summary = {{"shards", {{{"started_utc", "2026-11-03T00:00:00Z"}}, {{"started_utc", "2026-11-02T12:00:00Z"}}}},
                            {"lanes", {lane_of("tp", "pass", {judged_check("reference", {metric("loss", 10.0, 1, 2)}, {"noise"})})}}};
  mark_fragile_lanes(summary);
  const nlohmann::json history = headroom_history(past, summary);
  EXPECT_EQ(history["tp"], nlohmann::json::parse(R"([{"started_utc": "2026-11-01T00:00:00Z", "headroom_pct": 50.0},
      {"started_utc": "2026-11-02T00:00:00Z", "headroom_pct": 30.0}, {"started_utc": "2026-11-02T12:00:00Z", "headroom_pct": 10.0}])"));
  std::ofstream(dir.path("a/summary.json")) << R"({"kind": "nightly", "shards": [{}], "lanes": []})";
  try {
    read_history(dir.path(""), dir.path("now"));
    ADD_FAILURE() << "a summary without started_utc was read";
  } catch (const run::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a/summary.json is not a nightly summary (it lacks shards[0].started_utc)"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_THROW(read_history(dir.path("missing"), ""), run::UsageError);
}

}  // namespace
}  // namespace harness::nightly
