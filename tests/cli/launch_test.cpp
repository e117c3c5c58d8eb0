// `kiln launch` as a user or a scheduler runs it: torchrun's variables, "[rank R] " lines, exit
// statuses, restarts, flags refused by name, and workers that die with their launcher.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::kiln_binary;
using testing::TempDir;

struct Launched {
  int exit_code = -1;
  std::string out, err;
};

// `environment`: a prefix such as "env -u OMP_NUM_THREADS" to run the launcher under.
Launched run_launch(const std::string& arguments, const std::string& environment = "") {
  TempDir dir;
  const std::string command = environment + " " + kiln_binary() + " launch " + arguments + " >" + (dir / "out") +
                              " 2>" + (dir / "err") + " </dev/null";
  const int status = std::system(command.c_str());
  Launched launched;
  launched.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  launched.out = testing::read_file_bytes(dir / "out");
  launched.err = testing::read_file_bytes(dir / "err");
  return launched;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

TEST(Launch, WorkersGetTorchrunsVariablesAndPrefixedLines) {
  const Launched launched = run_launch(
      "--nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 1234 "
      "-- sh -c 'echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
      "$MASTER_ADDR $MASTER_PORT $KILN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $OMP_NUM_THREADS\"; "
      "echo \"to stderr\" >&2'",
      "env -u OMP_NUM_THREADS");
  ASSERT_EQ(launched.exit_code, 0) << launched.err;
  EXPECT_EQ(sorted_lines(launched.out),
            (std::vector<std::string>{"[rank 2] 2 4 0 2 1 10.1.2.3 1234 0 0 1",
                                      "[rank 3] 3 4 1 2 1 10.1.2.3 1234 0 0 1"}));
  EXPECT_EQ(sorted_lines(launched.err),
            (std::vector<std::string>{"[rank 2] to stderr", "[rank 3] to stderr",
                                      "kiln launch: 2 workers on node 1 of 2, world size 4, master "
                                      "10.1.2.3:1234",
                                      "kiln launch: OMP_NUM_THREADS is not set: each worker gets 1 OpenMP "
                                      "thread (set it to choose)"}));
  // A value the user set is left alone.
  const Launched chosen = run_launch("--nproc-per-node 2 -- sh -c 'echo $OMP_NUM_THREADS'", "env OMP_NUM_THREADS=3");
  EXPECT_EQ(sorted_lines(chosen.out), (std::vector<std::string>{"[rank 0] 3", "[rank 1] 3"}));
}

TEST(Launch, DefaultsAndStandalone) {
  const Launched defaults =
      run_launch("--nproc-per-node 1 -- sh -c 'echo $MASTER_ADDR:$MASTER_PORT'");
  ASSERT_EQ(defaults.exit_code, 0) << defaults.err;
  EXPECT_EQ(defaults.out, "[rank 0] 127.0.0.1:29500\n");
  EXPECT_EQ(defaults.err,
            "kiln launch: 1 worker on node 0 of 1, world size 1, master 127.0.0.1:29500\n");
  const Launched standalone =
      run_launch("--standalone --nproc-per-node 2 -- sh -c 'echo $MASTER_ADDR $MASTER_PORT'");
  ASSERT_EQ(standalone.exit_code, 0) << standalone.err;
  const std::vector<std::string> lines = sorted_lines(standalone.out);
  ASSERT_EQ(lines.size(), 2u) << standalone.out;
  const std::string port = lines[0].substr(lines[0].rfind(' ') + 1);
  EXPECT_EQ(lines[0], "[rank 0] 127.0.0.1 " + port);
  EXPECT_EQ(lines[1], "[rank 1] 127.0.0.1 " + port);  // one port for the whole group
  EXPECT_GT(std::stoi(port), 0);
  EXPECT_TRUE(contains(standalone.err, "master 127.0.0.1:" + port + "\n")) << standalone.err;
}

TEST(Launch, ExitStatusIsTheFailingWorkers) {
  const Launched failed =
      run_launch("--nproc-per-node 3 -- sh -c 'if [ $RANK = 2 ]; then exit 3; fi; exec sleep 30'");
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_TRUE(contains(failed.err, ") exited with status 3; stopping the other 2 workers\n"))
      << failed.err;
  EXPECT_TRUE(contains(failed.err, "kiln launch: rank 2 (pid ")) << failed.err;
  const Launched killed = run_launch(
      "--nproc-per-node 2 -- sh -c 'if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 30'");
  EXPECT_EQ(killed.exit_code, 137);
  EXPECT_TRUE(contains(killed.err, "was killed by signal 9 (Killed); stopping the other worker\n"))
      << killed.err;
}

TEST(Launch, LogRanksShowsOnlyThoseRanks) {
  const Launched launched =
      run_launch("--nproc-per-node 3 --log-ranks 0,2 -- sh -c 'echo hello $RANK'");
  ASSERT_EQ(launched.exit_code, 0) << launched.err;
  EXPECT_EQ(sorted_lines(launched.out),
            (std::vector<std::string>{"[rank 0] hello 0", "[rank 2] hello 2"}));
}

TEST(Launch, MaxRestartsStartsTheGroupAgain) {
  TempDir dir;
  const std::string resuming_worker = "-- sh -c 'if [ -e " + (dir / "marker") +
                                      " ]; then echo resumed at $KILN_RESTART_COUNT; else touch " +
                                      (dir / "marker") + "; exit 3; fi'";
  const Launched restarted = run_launch("--nproc-per-node 1 --max-restarts 2 " + resuming_worker);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_EQ(restarted.out, "[rank 0] resumed at 1\n");
  EXPECT_TRUE(contains(restarted.err, "kiln launch: restarting the workers (restart 1 of 2)\n"))
      << restarted.err;
  std::filesystem::remove(dir / "marker");
  const Launched no_restarts = run_launch("--nproc-per-node 1 " + resuming_worker);
  EXPECT_EQ(no_restarts.exit_code, 3);
  EXPECT_FALSE(contains(no_restarts.err, "restarting")) << no_restarts.err;
}

TEST(Launch, BadFlagsAreRefusedByName) {
  for (const auto& [flags, fragment] :
       {std::pair{"--nproc-per-node 0 -- true", "--nproc-per-node must be >= 1, got 0"},
        {"-- true", "--nproc-per-node is required"},
        {"--nproc-per-node 2 --standalone --nnodes 2 -- true",
         "--standalone runs one node: it cannot be "
         "combined with --nnodes 2"},
        {"--nproc-per-node 2 --standalone --master-port 6000 -- true",
         "cannot be combined with --master-port"},
        {"--nproc-per-node 2 --nnodes 2 --node-rank 2 -- true",
         "--node-rank must be in [0, --nnodes 2)"},
        {"--nproc-per-node 2 --nnodes 0 -- true", "--nnodes must be >= 1"},
        {"--nproc-per-node 2 --log-ranks 0,x -- true", "--log-ranks takes 'all' or ranks"},
        {"--nproc-per-node 2 --log-ranks 2 -- true",
         "--log-ranks: rank 2 is outside the world of 2"},
        {"--nproc-per-node 2 --max-restarts -1 -- true", "--max-restarts must be >= 0"},
        {"--nproc-per-node 2 --master-port 70000 -- true", "--master-port must be in [1, 65535]"},
        {"--nproc-per-node 2 --monitor-interval 0 -- true",
         "--monitor-interval must be in (0, 3600]"},
        {"--nproc-per-node 2", "kiln launch needs a COMMAND to run after --"},
        {"--nproc-per-node 2 --", "kiln launch needs a COMMAND to run after --"},
        {"--nproc-per-node 2 -- kiln-test-no-such-command",
         "cannot run 'kiln-test-no-such-command'"}}) {
    const Launched refused = run_launch(flags);
    EXPECT_NE(refused.exit_code, 0) << flags;
    EXPECT_TRUE(contains(refused.err, fragment)) << flags << ": " << refused.err;
    EXPECT_EQ(refused.out, "") << flags;
  }
}

// Alive: neither gone nor a zombie (workers orphaned by a killed launcher are reaped by whoever
// adopts them, perhaps late).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t name_end = text.rfind(')');
  return name_end != std::string::npos && name_end + 2 < text.size() && text[name_end + 2] != 'Z';
}

// Starts `kiln launch` in the background with two workers that write their pids and sleep; returns
// the launcher's pid once both workers are up.
pid_t start_sleeping_workers(const TempDir& dir, std::vector<pid_t>& workers) {
  const std::string command =
      "exec " + kiln_binary() + " launch --nproc-per-node 2 -- sh -c 'echo $$ > " +
      (dir / "pid-$RANK.tmp") + " && mv " + (dir / "pid-$RANK.tmp") + " " + (dir / "pid-$RANK") +
      " && exec sleep 30' >" + (dir / "out") + " 2>" + (dir / "err") + " </dev/null";
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!(std::filesystem::exists(dir / "pid-0") && std::filesystem::exists(dir / "pid-1")) &&
         std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (const char* name : {"pid-0", "pid-1"}) {
    std::ifstream in(dir / name);
    pid_t pid = 0;
    in >> pid;
    workers.push_back(pid);
  }
  return launcher;
}

void expect_workers_die(const std::vector<pid_t>& workers) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (pid_t pid : workers) {
    ASSERT_GT(pid, 0);
    while (alive(pid) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(alive(pid)) << "worker " << pid << " outlived its launcher";
  }
}

TEST(Launch, SigtermToTheLauncherStopsTheWorkersAndExits143) {
  TempDir dir;
  std::vector<pid_t> workers;
  const pid_t launcher = start_sleeping_workers(dir, workers);
  ::kill(launcher, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  EXPECT_TRUE(contains(testing::read_file_bytes(dir / "err"),
                       "kiln launch: received signal 15 (Terminated); stopping the 2 workers\n"));
  expect_workers_die(workers);
}

TEST(Launch, WorkersDieWithAKilledLauncher) {
  TempDir dir;
  std::vector<pid_t> workers;
  const pid_t launcher = start_sleeping_workers(dir, workers);
  ::kill(launcher, SIGKILL);  // no chance to stop them: PR_SET_PDEATHSIG must
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  expect_workers_die(workers);
}

}  // namespace
}  // namespace kiln
