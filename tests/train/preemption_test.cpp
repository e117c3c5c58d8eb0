// Megatron's clean stops as a scheduler triggers them: --exit-interval, --exit-duration-in-mins
// and --exit-signal-handler (SIGTERM: finish the iteration, save, exit 0), on one rank and on two
// ranks that must stop at the same iteration.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::kiln_binary;
using testing::run_command;
using testing::TempDir;

std::string tiny_train(const std::string& save, const std::string& extra) {
  return fmt::format(
      "{} train --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --vocab-size 64 --mock-data "
      "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --eval-iters 0 --log-interval 1 --num-workers 0 "
      "--distributed-timeout-minutes 0.5 --save {} {}",
      kiln_binary(), save, extra);
}

std::string tracker(const std::string& save) {
  return testing::read_file_bytes(save + "/latest_checkpointed_iteration.txt");
}

TEST(Preemption, ExitIntervalSavesAndExitsZero) {
  const TempDir dir;
  const CommandResult result = run_command(tiny_train(dir.path() + "/run", "--train-iters 10 --exit-interval 3"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("exiting at iteration 3: --exit-interval 3 reached"), std::string::npos)
      << result.output;
  EXPECT_EQ(tracker(dir.path() + "/run"), "3\n");
}

TEST(Preemption, ExitDurationSavesAndExitsZero) {
  const TempDir dir;
  const CommandResult result =
      run_command(tiny_train(dir.path() + "/run", "--train-iters 1000 --exit-duration-in-mins 1e-9"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("exiting at iteration 1: --exit-duration-in-mins 1e-09 reached"), std::string::npos)
      << result.output;
  EXPECT_EQ(tracker(dir.path() + "/run"), "1\n");
}

TEST(Preemption, SigtermToOneRankStopsEveryRankAtOneIterationWithACheckpoint) {
  // Slurm signals every task, but not at the same instant: here only rank 1 is told. Rank 0 must
  // stop at the same iteration (or the two would wait on each other forever), and both exit 0.
  const TempDir dir;
  const std::string save = dir.path() + "/run";
  const std::string train = tiny_train(save, "--train-iters 100000 --log-interval 1000 --exit-signal-handler");
  const std::string common =
      "OMP_NUM_THREADS=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(21000 + ::getpid() % 4000);
  const std::string log = dir.path() + "/rank0.log";
  const CommandResult result = run_command(
      "(" + common + " RANK=1 LOCAL_RANK=1 " + train + " > /dev/null 2>&1 & one=$!; " + common +
      " RANK=0 LOCAL_RANK=0 " + train + " > " + log + " 2>&1 & zero=$!; " +
      // Once rank 0 has logged training, tell rank 1 (bounded: 20 s).
      "for i in $(seq 400); do grep -q 'memory plan' " + log + " && break; sleep 0.05; done; sleep 0.3; " +
      "kill -TERM $one; wait $one; s1=$?; wait $zero; s0=$?; echo \"exit $s0 $s1\")");
  EXPECT_NE(result.output.find("exit 0 0"), std::string::npos) << result.output << testing::read_file_bytes(log);
  const std::string rank0 = testing::read_file_bytes(log);
  EXPECT_NE(rank0.find("SIGTERM received (--exit-signal-handler): saved, exiting cleanly"), std::string::npos)
      << rank0;
  EXPECT_FALSE(tracker(save).empty()) << rank0;
}

}  // namespace
}  // namespace kiln
