#include "lane_run.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "canary_pack.h"
#include "verdict.h"

extern char** environ;

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;

// The last non-empty line of a child's stderr.
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const std::size_t start = text.find_last_of('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

struct ChildResult {
  int status = 0;
  std::string stderr_tail;
};

// Runs argv (PATH lookup for a bare name) with `environment` set over ours; stdout goes to
// /dev/null, stderr is read back (its last 64 KiB kept).
ChildResult run_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment) {
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) {
    const std::string item(*e);
    const std::string key = item.substr(0, item.find('='));
    if (!environment.count(key)) env_text.push_back(item);
  }
  for (const auto& [key, value] : environment) {
    std::string v = value;
    if (key == "PYTHONPATH") {  // ours first, the caller's after it
      if (const char* existing = std::getenv("PYTHONPATH"); existing && *existing) v += std::string(":") + existing;
    }
    env_text.push_back(key + "=" + v);
  }
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw LaneCommandError(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw LaneCommandError(fmt::format("`{}` could not be started: {}", command_line(argv), std::strerror(rc)));
  }
  ChildResult result;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.stderr_tail.append(buffer, static_cast<std::size_t>(n));
    if (result.stderr_tail.size() > 131072) result.stderr_tail.erase(0, result.stderr_tail.size() - 65536);
  }
  close(fds[0]);
  while (waitpid(pid, &result.status, 0) < 0) {
    if (errno != EINTR) throw LaneCommandError(fmt::format("waiting for `{}`: {}", command_line(argv), std::strerror(errno)));
  }
  return result;
}

run::RunSummary run_external(const Matrix& matrix, const LaneSpec& spec, const std::string& out, const std::string& partial,
                             const std::string& pack, int threads) {
  std::vector<std::string> argv = expand_command(spec, pack, partial, matrix.steps, matrix.seed);
  if (spec.engine == "torch" && threads > 0) {
    argv.push_back("--threads");
    argv.push_back(std::to_string(threads));
  }
  const auto start = std::chrono::steady_clock::now();
  const ChildResult child = run_child(argv, spec.environment);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string where = fmt::format("lane {}: `{}`", spec.id, command_line(argv));
  if (!WIFEXITED(child.status) || WEXITSTATUS(child.status) != 0) {
    const std::string how = WIFEXITED(child.status) ? fmt::format("exited with status {}", WEXITSTATUS(child.status))
                                                    : fmt::format("was killed by signal {}", WTERMSIG(child.status));
    const std::string line = last_line(child.stderr_tail);
    throw LaneCommandError(fmt::format("{} {}: {}", where, how, line.empty() ? "(nothing on stderr)" : line));
  }
  if (!fs::exists(partial)) throw LaneCommandError(fmt::format("{} exited 0 but wrote no receipt at {{out}}", where));
  const check::ReceiptData receipt = check::load_receipt(partial);  // validates
  if (!receipt.complete) throw LaneCommandError(fmt::format("{} wrote an incomplete receipt (complete = 0)", where));
  if (receipt.steps() != matrix.steps) {
    throw LaneCommandError(fmt::format("{} wrote {} steps; the matrix runs {}", where, receipt.steps(), matrix.steps));
  }
  if (receipt.lane != spec.lane) {
    throw LaneCommandError(fmt::format("{} wrote lane {}; the matrix names it {}", where, receipt.lane, spec.lane));
  }
  const std::set<std::string> declared = check::budget_features(receipt);
  if (declared != std::set<std::string>(spec.budget_features.begin(), spec.budget_features.end())) {
    throw LaneCommandError(fmt::format("{} wrote a receipt that declares budget features '{}'; the matrix declares '{}'",
                                       where, fmt::join(declared, "+"), fmt::join(spec.budget_features, "+")));
  }
  run::RunSummary summary;
  summary.lane = receipt.lane;
  summary.steps = receipt.steps();
  summary.first_loss = receipt.loss.front();
  summary.last_loss = receipt.loss.back();
  summary.seconds = seconds;
  if (const auto it = receipt.manifest.find("threads"); it != receipt.manifest.end()) {
    summary.threads = std::atoi(it->second.c_str());
  }
  (void)out;
  return summary;
}

}  // namespace

std::string command_line(const std::vector<std::string>& argv) {
  std::vector<std::string> quoted;
  for (const std::string& a : argv) {
    quoted.push_back(a.find_first_of(" \t'\"") == std::string::npos && !a.empty() ? a : "'" + a + "'");
  }
  return fmt::format("{}", fmt::join(quoted, " "));
}

std::string export_matrix_pack(const Matrix& matrix, const std::string& path) {
  run::PackOptions o;
  o.canary = matrix.canary;
  o.steps = matrix.steps;
  o.seed = matrix.seed;
  o.out = path;
  o.force = true;
  run::export_pack(o);
  return path;
}

run::RunSummary run_lane(const Matrix& matrix, const LaneSpec& spec, const std::string& out,
                         const std::function<void(const run::StepProgress&)>& on_step, int threads,
                         const std::string& pack) {
  const std::string partial = out + ".partial";
  std::string own_pack;
  try {
    if (spec.external()) {
      std::error_code ignored;
      fs::remove(partial, ignored);  // the command may refuse to overwrite
      std::string use = pack;
      if (use.empty()) {  // in a temporary directory (never beside a golden), named as a job's pack
        std::string pattern = (fs::temp_directory_path() / "harness-lane-pack-XXXXXX").string();
        if (!mkdtemp(pattern.data())) {
          throw LaneCommandError(fmt::format("cannot create a temporary directory for the canary pack: {}", std::strerror(errno)));
        }
        own_pack = pattern;
        use = export_matrix_pack(matrix, (fs::path(own_pack) / "canary-pack.h5").string());
      }
      run::RunSummary summary = run_external(matrix, spec, out, partial, use, threads);
      if (!own_pack.empty()) fs::remove_all(own_pack, ignored);
      std::filesystem::rename(partial, out);
      summary.receipt_path = out;
      if (on_step) on_step(run::StepProgress{summary.steps - 1, summary.steps, summary.last_loss, summary.seconds});
      return summary;
    }
    run::RunOptions options = matrix.run_options(spec, partial);
    options.force = true;
    options.threads = threads;
    run::RunSummary summary = run::run_canary(options, on_step);
    std::filesystem::rename(partial, out);
    summary.receipt_path = out;
    return summary;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    if (!own_pack.empty()) std::filesystem::remove_all(own_pack, ignored);
    throw;
  }
}

}  // namespace harness::nightly
