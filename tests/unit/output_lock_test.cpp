// One writer per output: a second writer is refused naming the first; a reader's probe
// (`inspect --follow` asks whether the output is being written) never refuses a writer.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "output_lock.h"
#include "scratch_dir.h"

namespace harness::run {
namespace {

std::string refusal_of(const std::string& output) {
  try {
    const OutputLock second(output);
  } catch (const OutputBusy& e) {
    return e.what();
  }
  return "";
}

// `output`'s lock file, opened and flocked `how` (LOCK_SH: a reader's probe; LOCK_EX: a
// writer that is not an OutputLock); -1 where either fails.
int take_lock_file(const std::string& output, int how) {
  const int fd = ::open(OutputLock::lock_path(output).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0 && ::flock(fd, how | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(OutputLock, ASecondWriterIsRefusedNamingTheFirstAndTheLockGoesWithTheFirst) {
  const testing::ScratchDir dir;
  const std::string out = dir.path("run.h5");
  EXPECT_FALSE(OutputLock::held(out));
  {
    const OutputLock first(out);
    EXPECT_TRUE(OutputLock::held(out));
    const std::string refusal = refusal_of(out);
    EXPECT_NE(refusal.find("run.h5 is being written by process " + std::to_string(::getpid())), std::string::npos)
        << refusal;
    EXPECT_THROW(OutputLock::check_not_busy(out), OutputBusy);
  }
  EXPECT_FALSE(OutputLock::held(out));
  EXPECT_FALSE(std::filesystem::exists(OutputLock::lock_path(out)));
  EXPECT_NO_THROW(OutputLock::check_not_busy(out));
  EXPECT_FALSE(std::filesystem::exists(OutputLock::lock_path(out))) << "check_not_busy created the lock file";
}

// The race CI met: the writer has created its lock file and not yet locked it when a
// follower's probe takes its shared lock. Held here for 30 ms, far longer than a probe.
TEST(OutputLock, AWriterWaitsOutAReadersProbe) {
  const testing::ScratchDir dir;
  const std::string out = dir.path("followed.h5");
  const int probe = take_lock_file(out, LOCK_SH);
  ASSERT_GE(probe, 0);
  std::thread reader([probe] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ::flock(probe, LOCK_UN);
  });
  std::string refusal;
  try {
    const OutputLock writer(out);
    EXPECT_TRUE(OutputLock::held(out));
  } catch (const OutputBusy& e) {
    refusal = e.what();
  }
  reader.join();
  ::close(probe);
  EXPECT_EQ(refusal, "") << "a reader's probe refused the writer";
}

// A lock held past the grace is a writer, not a probe: refused, and the message says what to do.
TEST(OutputLock, ALockHeldPastTheReadersGraceRefuses) {
  const testing::ScratchDir dir;
  const std::string out = dir.path("held.h5");
  const int holder = take_lock_file(out, LOCK_EX);
  ASSERT_GE(holder, 0);
  const std::string refusal = refusal_of(out);
  ::close(holder);
  EXPECT_NE(refusal.find("held.h5 is being written by another process: wait for it to finish, or write elsewhere"),
            std::string::npos)
      << refusal;
}

}  // namespace
}  // namespace harness::run
