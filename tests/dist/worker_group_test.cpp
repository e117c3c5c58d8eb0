// WorkerGroup with `sh -c` workers: environments, whole prefixed lines, rank filtering, the stop
// path (SIGTERM, grace, SIGKILL), signals to the launcher, and restarts.
#include "kiln/dist/worker_group.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using dist::GroupExit;
using dist::WorkerGroup;
using dist::WorkerGroupOptions;
using testing::TempDir;

// Workers running `sh -c script`, rank r given RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT.
WorkerGroupOptions sh_workers(int count, const std::string& script) {
  WorkerGroupOptions options;
  options.command = {"sh", "-c", script};
  for (int rank = 0; rank < count; ++rank)
    options.workers.push_back(
        {rank,
         {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(count),
          "LOCAL_RANK=" + std::to_string(rank), "MASTER_PORT=29511"}});
  return options;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// Reaped workers are gone: no process, not even a zombie, has their pid.
void expect_all_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH) << "pid " << pid;
  }
}

struct Ran {
  GroupExit exit;
  std::string out, err;  // what the group wrote to its stdout_fd and stderr_fd
  std::vector<pid_t> pids;
  double seconds = 0;
};

// Captures the group's output in files: a pipe could fill up while the group runs.
class Capture {
 public:
  Capture() {
    out_fd_ = ::open((dir_ / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    err_fd_ = ::open((dir_ / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  ~Capture() {
    ::close(out_fd_);
    ::close(err_fd_);
  }
  void attach(WorkerGroupOptions& options) const {
    options.stdout_fd = out_fd_;
    options.stderr_fd = err_fd_;
  }
  std::string out() const { return testing::read_file_bytes(dir_ / "out"); }
  std::string err() const { return testing::read_file_bytes(dir_ / "err"); }

 private:
  TempDir dir_;
  int out_fd_ = -1, err_fd_ = -1;
};

Ran run_group(WorkerGroupOptions options) {
  Capture capture;
  capture.attach(options);
  Ran ran;
  const auto begin = std::chrono::steady_clock::now();
  {
    WorkerGroup group(std::move(options));
    group.start();
    ran.pids = group.pids();
    ran.exit = group.wait();
  }
  ran.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ran.out = capture.out();
  ran.err = capture.err();
  return ran;
}

// Sets a variable of this process for one scope, then puts back what was there.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedVariable() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(WorkerGroup, EnvironmentReachesEachWorkerOverTheLaunchers) {
  Ran ran;
  {
    ScopedVariable inherited("KILN_TEST_FROM_LAUNCHER", "inherited");
    ScopedVariable replaced("RANK", "99");  // the worker's own value wins
    ran = run_group(sh_workers(
        3, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_PORT $KILN_TEST_FROM_LAUNCHER\""));
  }
  EXPECT_EQ(ran.exit.status, 0) << ran.err;
  EXPECT_EQ(ran.exit.failed_rank, -1);
  std::vector<std::string> lines = lines_of(ran.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] 0 3 0 29511 inherited",
                                             "[rank 1] 1 3 1 29511 inherited",
                                             "[rank 2] 2 3 2 29511 inherited"}));
  EXPECT_EQ(ran.err, "");
  expect_all_gone(ran.pids);
}

TEST(WorkerGroup, LinesStayWholeAndPrefixedUnderConcurrentWriters) {
  // Four workers write 200 lines each as fast as they can, interleaved in time, plus one line of
  // 100 000 bytes that reaches the launcher in several reads, and a stderr line.
  const Ran ran = run_group(
      sh_workers(4,
                 "i=0; while [ $i -lt 200 ]; do "
                 "echo \"line $i of rank $RANK ................................\"; i=$((i+1)); "
                 "done; head -c 100000 /dev/zero | tr '\\0' x; echo; echo \"done $RANK\" >&2"));
  ASSERT_EQ(ran.exit.status, 0) << ran.err;
  const std::regex short_line(R"(\[rank (\d)\] line (\d+) of rank (\d) \.{32})");
  std::map<int, int> next_index;
  std::map<int, int> long_lines;
  for (const std::string& line : lines_of(ran.out)) {
    std::smatch match;
    if (std::regex_match(line, match, short_line)) {
      EXPECT_EQ(match[1], match[3]) << line;
      const int rank = std::stoi(match[1]);
      EXPECT_EQ(std::stoi(match[2]), next_index[rank]++) << line;  // in order, none lost
    } else {
      ASSERT_EQ(line.size(), 9u + 100000u) << line.substr(0, 80);
      const int rank = line[6] - '0';
      EXPECT_EQ(line.substr(0, 9), "[rank " + std::to_string(rank) + "] ");
      EXPECT_EQ(line.find_first_not_of('x', 9), std::string::npos);
      ++long_lines[rank];
    }
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(next_index[rank], 200) << "rank " << rank;
    EXPECT_EQ(long_lines[rank], 1) << "rank " << rank;
  }
  std::vector<std::string> err_lines = lines_of(ran.err);
  std::sort(err_lines.begin(), err_lines.end());
  EXPECT_EQ(err_lines, (std::vector<std::string>{"[rank 0] done 0", "[rank 1] done 1",
                                                 "[rank 2] done 2", "[rank 3] done 3"}));
}

TEST(WorkerGroup, ShownRanksFilterBothStreams) {
  WorkerGroupOptions options = sh_workers(4, "echo \"out $RANK\"; echo \"err $RANK\" >&2");
  options.shown_ranks = {0, 2};
  const Ran ran = run_group(std::move(options));
  ASSERT_EQ(ran.exit.status, 0);
  std::vector<std::string> out = lines_of(ran.out), err = lines_of(ran.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank 0] out 0", "[rank 2] out 2"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] err 0", "[rank 2] err 2"}));
}

TEST(WorkerGroup, FinalLineWithoutNewlineIsCompleted) {
  const Ran ran = run_group(sh_workers(1, "printf 'first\\nno newline'; printf 'on stderr' >&2"));
  ASSERT_EQ(ran.exit.status, 0);
  EXPECT_EQ(ran.out, "[rank 0] first\n[rank 0] no newline\n");
  EXPECT_EQ(ran.err, "[rank 0] on stderr\n");
}

TEST(WorkerGroup, FailingWorkerStopsTheOthersAndGivesItsStatus) {
  const Ran ran = run_group(
      sh_workers(4, "if [ $RANK = 1 ]; then echo 'out of memory' >&2; exit 3; fi; exec sleep 30"));
  EXPECT_EQ(ran.exit.status, 3);
  EXPECT_EQ(ran.exit.failed_rank, 1);
  EXPECT_EQ(ran.exit.launcher_signal, 0);
  EXPECT_LT(ran.seconds, 3.0);
  const std::string expected = "kiln launch: rank 1 (pid " + std::to_string(ran.pids[1]) +
                               ") exited with status 3; stopping the other 3 workers\n";
  // The worker's last words come before the launcher's line about it.
  EXPECT_EQ(ran.err, "[rank 1] out of memory\n" + expected);
  expect_all_gone(ran.pids);
}

TEST(WorkerGroup, WorkerKilledBySignalGives128PlusSignal) {
  const Ran ran = run_group(sh_workers(2, "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 30"));
  EXPECT_EQ(ran.exit.status, 137);
  EXPECT_EQ(ran.exit.failed_rank, 0);
  EXPECT_TRUE(
      contains(ran.err, "rank 0 (pid " + std::to_string(ran.pids[0]) +
                            ") was killed by signal 9 (Killed); stopping the other worker\n"))
      << ran.err;
  EXPECT_LT(ran.seconds, 3.0);
  expect_all_gone(ran.pids);
}

TEST(WorkerGroup, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  // Rank 0 fails only once rank 1 ignores SIGTERM, so the stop path meets a stubborn worker.
  WorkerGroupOptions options =
      sh_workers(2, "if [ $RANK = 1 ]; then trap '' TERM; touch " + (dir / "ready") +
                        "; exec sleep 30; fi; while [ ! -e " + (dir / "ready") +
                        " ]; do sleep 0.02; done; exit 5");
  options.grace_seconds = 0.5;
  const Ran ran = run_group(std::move(options));
  EXPECT_EQ(ran.exit.status, 5);
  EXPECT_EQ(ran.exit.failed_rank, 0);
  EXPECT_GE(ran.seconds, 0.5);
  EXPECT_LT(ran.seconds, 2.5);
  EXPECT_TRUE(
      contains(ran.err, "kiln launch: 1 worker still running 0.5 s after SIGTERM; sending SIGKILL"))
      << ran.err;
  expect_all_gone(ran.pids);
}

TEST(WorkerGroup, SigtermToTheLauncherIsForwardedAndEndsTheGroup) {
  Capture capture;
  WorkerGroupOptions options = sh_workers(2, "exec sleep 30");
  capture.attach(options);
  GroupExit exit;
  std::vector<pid_t> pids;
  {
    WorkerGroup group(std::move(options));
    group.start();
    pids = group.pids();
    std::thread sender([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(::getpid(), SIGTERM);  // caught by the group's handler, never by the default action
    });
    exit = group.wait();
    sender.join();
  }
  EXPECT_EQ(exit.status, 128 + SIGTERM);
  EXPECT_EQ(exit.launcher_signal, SIGTERM);
  EXPECT_EQ(exit.failed_rank, -1);
  EXPECT_EQ(capture.err(),
            "kiln launch: received signal 15 (Terminated); stopping the 2 workers\n");
  expect_all_gone(pids);
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);  // the group gave the handler back
}

TEST(WorkerGroup, CommandNotFoundIsAnErrorNamingIt) {
  WorkerGroupOptions options = sh_workers(3, "");
  options.command = {"kiln-test-no-such-command", "--flag"};
  WorkerGroup group(std::move(options));
  try {
    group.start();
    FAIL() << "start() did not throw";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "cannot run 'kiln-test-no-such-command': No such file or directory");
  }
  expect_all_gone(group.pids());
}

// Workers that fail at their first start and succeed when started again, as a training run
// resuming from its checkpoint would: rank 0 leaves the "checkpoint" (a marker file) and fails;
// the others wait to be stopped, unless they already see the marker.
dist::WorkerGroupOptions resuming_workers(const TempDir& dir, const Capture& capture, int restart) {
  const std::string marker = dir / "marker";
  WorkerGroupOptions options = sh_workers(
      2, "if [ -e " + marker + " ]; then echo \"resumed at $KILN_RESTART_COUNT\"; exit 0; fi; " +
             "if [ $RANK = 0 ]; then touch " + marker + "; exit 3; fi; exec sleep 30");
  for (dist::WorkerSpec& worker : options.workers)
    worker.environment.push_back("KILN_RESTART_COUNT=" + std::to_string(restart));
  capture.attach(options);
  return options;
}

TEST(WorkerGroup, RestartAfterAFailureSucceeds) {
  TempDir dir;
  Capture capture;
  const int status = dist::run_with_restarts(
      1, [&](int restart) { return resuming_workers(dir, capture, restart); });
  EXPECT_EQ(status, 0) << capture.err();
  const std::string out = capture.out();
  EXPECT_TRUE(contains(out, "[rank 0] resumed at 1\n")) << out;
  EXPECT_TRUE(contains(out, "[rank 1] resumed at 1\n")) << out;
  EXPECT_TRUE(contains(capture.err(), "kiln launch: rank 0 (pid "));
  EXPECT_TRUE(contains(capture.err(), "kiln launch: restarting the workers (restart 1 of 1)\n"))
      << capture.err();
}

TEST(WorkerGroup, NoRestartsLeftFailsWithTheWorkersStatus) {
  TempDir dir;
  Capture capture;
  EXPECT_EQ(dist::run_with_restarts(
                0, [&](int restart) { return resuming_workers(dir, capture, restart); }),
            3);
  EXPECT_FALSE(contains(capture.err(), "restarting")) << capture.err();
  Capture capture_two;
  const int status = dist::run_with_restarts(2, [&](int) {
    WorkerGroupOptions options = sh_workers(1, "exit 4");
    capture_two.attach(options);
    return options;
  });
  EXPECT_EQ(status, 4);
  const std::string err = capture_two.err();
  EXPECT_TRUE(contains(err, "restarting the workers (restart 1 of 2)\n")) << err;
  EXPECT_TRUE(contains(err, "restarting the workers (restart 2 of 2)\n")) << err;
  EXPECT_TRUE(contains(err, "kiln launch: giving up after 2 restarts\n")) << err;
}

TEST(WorkerGroup, FreePortIsBindable) {
  const int port = dist::find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

}  // namespace
}  // namespace kiln
