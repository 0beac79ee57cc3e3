// One writer per output. A run, a nightly or a golden approval holds an exclusive lock on
// `<output>.lock` while it writes; a second writer of the same output is refused at once,
// with or without --force, naming the process that holds it. The lock is flock(2)'s:
// the kernel drops it when its holder dies, so a killed run never blocks the next one.
#pragma once

#include <stdexcept>
#include <string>

namespace harness::run {

// Another process is writing the output: the message names the output, its process id and
// command line, and what to do.
struct OutputBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class OutputLock {
 public:
  // Takes `<output>.lock` or throws OutputBusy (FileError when the lock file cannot be made).
  explicit OutputLock(const std::string& output);
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  ~OutputLock();  // removes the lock file, then releases the lock

  static std::string lock_path(const std::string& output) { return output + ".lock"; }
  // Throws OutputBusy when a live writer holds `output`'s lock; creates nothing.
  static void check_not_busy(const std::string& output);
  // Whether a live writer holds `output`'s lock.
  static bool held(const std::string& output);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace harness::run
