#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

extern char** environ;

namespace harness::run {
namespace {

// The environment of the child: ours, with `environment` set over it.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& environment) {
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
  return env_text;
}

// Reads the child's captured pipes (-1: none) to their ends, both at once (a child that
// fills one pipe while we wait on the other would wait forever): stdout whole, stderr's
// last 64 KiB or more.
void read_pipes(int out_fd, int err_fd, ChildResult& result) {
  constexpr std::size_t kStderrTail = 65536;
  std::vector<pollfd> fds;
  if (out_fd >= 0) fds.push_back({out_fd, POLLIN, 0});
  if (err_fd >= 0) fds.push_back({err_fd, POLLIN, 0});
  char buffer[4096];
  while (!fds.empty()) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw ChildProcessError(fmt::format("cannot read the child's output: {}", std::strerror(errno)));
    }
    for (std::size_t i = fds.size(); i-- > 0;) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      std::string& text = fds[i].fd == out_fd ? result.stdout_text : result.stderr_tail;
      text.append(buffer, static_cast<std::size_t>(n));
      if (fds[i].fd == err_fd && text.size() > 2 * kStderrTail) text.erase(0, text.size() - kStderrTail);
    }
  }
}

struct Pipe {
  int read = -1, write = -1;
};

Pipe open_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw ChildProcessError(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  return {fds[0], fds[1]};
}

}  // namespace

bool ChildResult::exited_zero() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int ChildResult::exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string ChildResult::how() const {
  return WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                           : fmt::format("was killed by signal {}", WTERMSIG(status));
}

ChildResult run_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment,
                      ChildOutput stdout_mode, ChildOutput stderr_mode) {
  const std::vector<std::string> env_text = child_environment(environment);
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  Pipe out, err;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_mode == ChildOutput::kDiscard) posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  if (stdout_mode == ChildOutput::kCapture) {
    out = open_pipe();
    posix_spawn_file_actions_adddup2(&actions, out.write, 1);
  }
  if (stderr_mode == ChildOutput::kDiscard) posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  if (stderr_mode == ChildOutput::kCapture) {
    err = open_pipe();
    posix_spawn_file_actions_adddup2(&actions, err.write, 2);
  }
  if (stdout_mode == ChildOutput::kStderr) posix_spawn_file_actions_adddup2(&actions, 2, 1);  // after stderr's
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  for (const int fd : {out.write, err.write}) {
    if (fd >= 0) close(fd);
  }
  if (rc != 0) {
    for (const int fd : {out.read, err.read}) {
      if (fd >= 0) close(fd);
    }
    throw ChildProcessError(fmt::format("`{}` could not be started: {}", command_line(argv), std::strerror(rc)));
  }
  ChildResult result;
  try {
    read_pipes(out.read, err.read, result);
  } catch (...) {
    for (const int fd : {out.read, err.read}) {
      if (fd >= 0) close(fd);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw;
  }
  for (const int fd : {out.read, err.read}) {
    if (fd >= 0) close(fd);
  }
  while (waitpid(pid, &result.status, 0) < 0) {
    if (errno != EINTR) throw ChildProcessError(fmt::format("waiting for `{}`: {}", command_line(argv), std::strerror(errno)));
  }
  return result;
}

std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const std::size_t start = text.find_last_of('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

std::string command_line(const std::vector<std::string>& argv) {
  std::vector<std::string> quoted;
  for (const std::string& a : argv) {
    quoted.push_back(a.find_first_of(" \t'\"") == std::string::npos && !a.empty() ? a : "'" + a + "'");
  }
  return fmt::format("{}", fmt::join(quoted, " "));
}

}  // namespace harness::run
