#include "output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "file_io.h"

namespace harness::run {
namespace {

// "PID COMMAND LINE" of this process, for the message another writer gets.
std::string holder_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : cmdline) c = c == '\0' ? ' ' : c;
  while (!cmdline.empty() && cmdline.back() == ' ') cmdline.pop_back();
  return fmt::format("{} {}\n", getpid(), cmdline);
}

std::string describe_holder(const std::string& lock_path) {
  std::ifstream in(lock_path);
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line);
  std::string pid, command;
  fields >> pid;
  std::getline(fields, command);
  if (pid.empty()) return "another process";
  return command.empty() ? fmt::format("process {}", pid) : fmt::format("process {} ({})", pid, command.substr(1));
}

// A reader asking whether the output is being written (held(), below, which `inspect
// --follow` polls) holds a shared lock for microseconds; a writer that meets one waits it
// out. Another writer holds the lock for its whole run and is still there at the deadline.
// Without the wait CI refused 1 run of 8 read by four followers (cli.interrupt_and_lock).
// Returns 0 or the errno of the last attempt.
int lock_exclusive_past_readers(int fd) {
  constexpr auto kReaderGrace = std::chrono::milliseconds(250);
  const auto deadline = std::chrono::steady_clock::now() + kReaderGrace;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) return error;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return 0;
}

}  // namespace

OutputLock::OutputLock(const std::string& output) : path_(lock_path(output)) {
  // A lock file removed by its previous holder between our open and our flock would leave
  // us holding a lock nobody else sees: retry until the locked file is the one at the path.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw FileError(fmt::format("{}: cannot create the writer's lock file ({})", path_, std::strerror(errno)));
    if (const int error = lock_exclusive_past_readers(fd_); error != 0) {
      ::close(fd_);
      fd_ = -1;
      if (error != EWOULDBLOCK) throw FileError(fmt::format("{}: cannot lock ({})", path_, std::strerror(error)));
      throw OutputBusy(fmt::format("{} is being written by {}: wait for it to finish, or write elsewhere", output,
                                   describe_holder(path_)));
    }
    struct stat held {}, at_path {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 && held.st_ino == at_path.st_ino &&
        held.st_dev == at_path.st_dev) {
      const std::string line = holder_line();
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
        // The lock holds without the note; the other writer's message just says less.
      }
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw FileError(fmt::format("{}: the lock file keeps being replaced; is another writer looping?", path_));
}

bool OutputLock::held(const std::string& output) {
  const int fd = ::open(lock_path(output).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no lock file: no writer
  const bool busy = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return busy;
}

void OutputLock::check_not_busy(const std::string& output) {
  const std::string path = lock_path(output);
  if (held(output)) {
    throw OutputBusy(fmt::format("{} is being written by {}: wait for it to finish, or write elsewhere", output,
                                 describe_holder(path)));
  }
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: a waiting writer re-checks the path (above)
  ::close(fd_);
}

}  // namespace harness::run
