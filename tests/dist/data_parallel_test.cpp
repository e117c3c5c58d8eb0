// Data-parallel training over Gloo, with real processes on 127.0.0.1 started by `kiln launch`
// (or by hand with torchrun's variables), against one process with the same global batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/dist/worker_group.h"
#include "kiln/train/safetensors.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::kiln_binary;
using testing::run_command;
using testing::TempDir;

// A 2-layer GPT on random tokens, 4 steps, validated every 2, saved at the end; ~15 gradient
// buckets of 2000 elements, so the reduction overlaps the backward.
struct TinyRun {
  std::string save{};
  int micro_batch = 2;
  std::string extra{};             // more flags
  std::string hidden_size = "32";  // text: a shell expression in one test
  int bucket_size = 2000;
  int train_iters = 4;
  int eval_iters = 2;
  int global_batch = 4;
};

std::string tiny_run(const TinyRun& run) {
  return fmt::format(
      "train --num-layers 2 --hidden-size {} --num-attention-heads 2 --seq-length 16 --vocab-size 64 --mock-data "
      "--micro-batch-size {} --global-batch-size {} --train-iters {} --lr 1e-3 --eval-iters {} --eval-interval 2 "
      "--log-interval 1 --num-workers 0 --ddp-bucket-size {} --distributed-timeout-minutes 0.5 --save {} {}",
      run.hidden_size, run.micro_batch, run.global_batch, run.train_iters, run.eval_iters, run.bucket_size, run.save,
      run.extra);
}

std::string tiny_run(const std::string& save, int micro_batch, const std::string& extra = "") {
  return tiny_run(TinyRun{save, micro_batch, extra});
}

// Rank r of `ranks` started by hand with torchrun's variables, running `command`.
std::string rank_by_hand(int r, const std::string& port, const std::string& command, int ranks = 2) {
  return fmt::format("OMP_NUM_THREADS=1 WORLD_SIZE={} LOCAL_WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} "
                     "RANK={} LOCAL_RANK={} {}",
                     ranks, ranks, port, r, r, command);
}

CommandResult launch(int ranks, const std::string& train_arguments) {
  return run_command(fmt::format("OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node {} -- {} {}",
                                 kiln_binary(), ranks, kiln_binary(), train_arguments));
}

CommandResult single(const std::string& train_arguments) {
  return run_command(fmt::format("OMP_NUM_THREADS=1 {} {}", kiln_binary(), train_arguments));
}

// The log's numbers that every rank count must reproduce: each iteration's loss, loss scale and
// gradient norm and each validation loss, as printed (rank prefixes removed).
std::vector<std::string> logged_numbers(const std::string& output) {
  static const std::regex number(
      R"(((?:lm )?loss(?: value)?|loss scale|grad norm|skipped iterations|accuracy|F1): +([^ |]+))");
  std::vector<std::string> numbers;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), number); it != std::sregex_iterator(); ++it)
    numbers.push_back((*it)[1].str() + "=" + (*it)[2].str());
  return numbers;
}

std::vector<float> tensor_values(const SafetensorsEntry& entry) {
  std::vector<float> values(static_cast<size_t>(entry.shape.numel()));
  EXPECT_EQ(entry.dtype, DType::F32) << entry.name;
  std::memcpy(values.data(), entry.data, values.size() * sizeof(float));
  return values;
}

// Largest absolute difference between two runs' files, tensor by tensor (the same names).
double largest_difference(const std::string& file_a, const std::string& file_b) {
  const SafetensorsFile a(file_a), b(file_b);
  EXPECT_EQ(a.entries().size(), b.entries().size());
  double largest = 0.0;
  for (const auto& [name, entry] : a.entries()) {
    const std::vector<float> x = tensor_values(entry), y = tensor_values(b.get(name));
    EXPECT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
      largest = std::max(largest, std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i])));
  }
  return largest;
}

std::string checkpoint(const TempDir& dir, const std::string& run, const std::string& file, int iteration = 4) {
  return fmt::format("{}/{}/iter_{:07d}/{}", dir.path(), run, iteration, file);
}

double value_of(const std::string& logged) { return std::stod(logged.substr(logged.find('=') + 1)); }

// Two runs' logs name the same quantities in the same order, each within `relative` of the other.
void expect_same_log(const std::string& expected_output, const std::string& output, double relative) {
  const std::vector<std::string> expected = logged_numbers(expected_output), got = logged_numbers(output);
  ASSERT_EQ(got.size(), expected.size()) << output;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].substr(0, got[i].find('=')), expected[i].substr(0, expected[i].find('=')));
    const double a = value_of(expected[i]), b = value_of(got[i]);
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b)) << expected[i] << " vs " << got[i];
      continue;
    }
    EXPECT_NEAR(a, b, relative * std::max(1.0, std::fabs(a))) << expected[i] << " vs " << got[i];
  }
}

// The bound between runs whose gradient sums differ only in rounding order: the one-rank run's
// accumulation adds each micro-batch inside BLAS's products (beta = 1, block by block), the ranks
// add whole gradients, so the same numbers are summed in another order. Four Adam steps at
// lr 1e-3 move a parameter by about 4e-3; a wrong slice of the data or a wrong average moves it by
// that much, rounding by far less than 1e-5 (measured: 3e-7 at 2 and at 4 ranks).
constexpr double kRoundingBound = 1e-5;

// This file is tests/dist/data_parallel_test.cpp.
const std::filesystem::path kRepository = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();

struct Setting {
  const char* name;
  const char* flags;
};

class DataParallel : public ::testing::TestWithParam<Setting> {};

TEST_P(DataParallel, TwoRanksEqualOneRankWithTwiceTheAccumulation) {
  const TempDir dir;
  const std::string flags = GetParam().flags;
  const CommandResult one = single(tiny_run(dir.path() + "/one", 2, flags));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult two = launch(2, tiny_run(dir.path() + "/two", 2, flags));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("data-parallel 2 x accumulation 1 = global 4"), std::string::npos) << two.output;
  EXPECT_NE(one.output.find("data-parallel 1 x accumulation 2 = global 4"), std::string::npos) << one.output;
  // The log line shows the wait for the reduction on many ranks only.
  EXPECT_TRUE(std::regex_search(two.output, std::regex(R"(\| grads reduce wait \(ms\): [0-9.]+ \(ranks )"
                                                        R"([0-9.]+-[0-9.]+, longest rank [01]\) \|)")))
      << "rank 0's wait and every rank's spread: " << two.output;
  EXPECT_EQ(one.output.find("grads reduce wait"), std::string::npos) << one.output;
  // Every iteration logs loss, loss scale, grad norm and skipped count; two validations.
  ASSERT_EQ(logged_numbers(one.output).size(), 4u * 4u + 2u) << one.output;
  // The first loss is the same bits: the same parameters and samples, gathered per micro-batch.
  EXPECT_EQ(logged_numbers(two.output).front(), logged_numbers(one.output).front());
  expect_same_log(one.output, two.output, 1e-5);
  EXPECT_LT(largest_difference(checkpoint(dir, "one", "model.safetensors"), checkpoint(dir, "two", "model.safetensors")),
            kRoundingBound);
  EXPECT_LT(
      largest_difference(checkpoint(dir, "one", "optimizer.safetensors"), checkpoint(dir, "two", "optimizer.safetensors")),
      kRoundingBound);
}

// fp16 starts at a scale that overflows, so the first steps are skipped on every rank alike and
// the scale grows back within the run.
INSTANTIATE_TEST_SUITE_P(
    Settings, DataParallel,
    ::testing::Values(Setting{"fp32", ""},
                      Setting{"fp16_loss_scaling", "--fp16 --initial-loss-scale 1e6 --loss-scale-window 1 --hysteresis 1"},
                      Setting{"bf16", "--bf16"},
                      // the ranks' amax agreed: the casts, so the products, as one rank's
                      Setting{"fp8", "--bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max"},
                      Setting{"full_recompute", "--recompute-granularity full --recompute-method uniform"},
                      // each micro-batch's masks named by its index in the global batch, not its rank
                      Setting{"hidden_dropout", "--hidden-dropout 0.1"},
                      Setting{"attention_dropout", "--attention-dropout 0.1"}),
    [](const auto& info) { return std::string(info.param.name); });

// The encoder classifier through the same data-parallel path (its gradients reach the buckets
// through the Model's listener; it has no tied embedding to defer), with its default dropout on:
// each micro-batch's masks are named by its index in the global batch, so two ranks draw one
// rank's. Validation's accuracy and F1 come from counts summed over the ranks: the same values.
TEST(DataParallelClassifier, TwoRanksEqualOneRankWithTwiceTheAccumulation) {
  const TempDir dir;
  const std::string flags = "--model encoder-classifier --num-intermediate-layers 1";
  const CommandResult one = single(tiny_run(dir.path() + "/one", 2, flags));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult two = launch(2, tiny_run(dir.path() + "/two", 2, flags));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(one.output.find("hidden dropout 0.1"), std::string::npos) << one.output;
  // 4 iterations of 4 numbers; two validations of loss, accuracy and F1.
  ASSERT_EQ(logged_numbers(one.output).size(), 4u * 4u + 2u * 3u) << one.output;
  EXPECT_EQ(logged_numbers(two.output).front(), logged_numbers(one.output).front());
  expect_same_log(one.output, two.output, 1e-5);
  EXPECT_LT(largest_difference(checkpoint(dir, "one", "model.safetensors"), checkpoint(dir, "two", "model.safetensors")),
            kRoundingBound);
}

TEST(DataParallelTwoRanks, OverlapAndBucketSizeLeaveTheSameBits) {
  // Two ranks sum pairs, exact in any order, so where the buckets are cut and when they start
  // cannot change a bit.
  const TempDir dir;
  const CommandResult overlapped = launch(2, tiny_run(dir.path() + "/overlapped", 2));
  ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
  const CommandResult after = launch(2, tiny_run(TinyRun{.save = dir.path() + "/after", .extra = "--no-overlap-grad-reduce", .bucket_size = 0}));
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_EQ(logged_numbers(after.output), logged_numbers(overlapped.output));
  EXPECT_EQ(largest_difference(checkpoint(dir, "overlapped", "model.safetensors"),
                               checkpoint(dir, "after", "model.safetensors")),
            0.0);
}

class DataParallelFourRanks : public ::testing::TestWithParam<Setting> {};

TEST_P(DataParallelFourRanks, EqualOneRankWithFourTimesTheAccumulation) {
  const TempDir dir;
  const std::string flags = GetParam().flags;
  const CommandResult one = single(tiny_run(dir.path() + "/one", 1, flags));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult four = launch(4, tiny_run(dir.path() + "/four", 1, flags));
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_NE(four.output.find("data-parallel 4 x accumulation 1 = global 4"), std::string::npos) << four.output;
  EXPECT_EQ(logged_numbers(four.output).front(), logged_numbers(one.output).front());
  expect_same_log(one.output, four.output, 1e-5);
  EXPECT_LT(largest_difference(checkpoint(dir, "one", "model.safetensors"), checkpoint(dir, "four", "model.safetensors")),
            kRoundingBound);
}

// fp16's first steps overflow and are skipped on all four ranks alike (as with two, above).
INSTANTIATE_TEST_SUITE_P(
    Settings, DataParallelFourRanks,
    ::testing::Values(Setting{"fp32", ""},
                      Setting{"fp16_loss_scaling", "--fp16 --initial-loss-scale 1e6 --loss-scale-window 1 --hysteresis 1"},
                      Setting{"bf16_full_recompute", "--bf16 --recompute-granularity full --recompute-method uniform"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DistributedOptimizer, ZeroOneTrainsAsPlainDataParallelism) {
  // Two ranks: each steps half of the optimizer state, then the parameters are gathered. Only the
  // gradient norm's sum (two partial sums) is rounded in another order.
  const TempDir dir;
  const CommandResult plain = launch(2, tiny_run(dir.path() + "/plain", 2));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const CommandResult zero = launch(2, tiny_run(dir.path() + "/zero", 2, "--use-distributed-optimizer"));
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_NE(zero.output.find("this rank's shard, 1/2 (ZeRO-1)"), std::string::npos) << zero.output;
  expect_same_log(plain.output, zero.output, 1e-5);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_LT(largest_difference(checkpoint(dir, "plain", file), checkpoint(dir, "zero", file)), kRoundingBound)
        << file;
}

TEST(DistributedOptimizer, ThreeRanksWithPaddedShardsAndOverlappedGatherTrainAsOneRank) {
  const TempDir dir;
  const CommandResult one = single(tiny_run(TinyRun{.save = dir.path() + "/one", .global_batch = 6}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult three = launch(3, tiny_run(TinyRun{.save = dir.path() + "/three",
                                                         .extra = "--use-distributed-optimizer --overlap-param-gather",
                                                         .global_batch = 6}));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  expect_same_log(one.output, three.output, 1e-5);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_LT(largest_difference(checkpoint(dir, "one", file), checkpoint(dir, "three", file)), kRoundingBound)
        << file;
}

// Saved at iteration 2 by `saver` ranks, resumed by `resumer` ranks to iteration 4: the same as
// the saver's uninterrupted run, with the same global batch and data position.
struct Resharding {
  int saver, resumer;
  bool zero;
};

class CheckpointsAcrossSizes : public ::testing::TestWithParam<Resharding> {};

TEST_P(CheckpointsAcrossSizes, AResumedRunContinuesTheUninterruptedOne) {
  const auto [saver, resumer, zero] = GetParam();
  const TempDir dir;
  const std::string flags = zero ? "--use-distributed-optimizer" : "";
  const auto run = [&](int ranks, const std::string& save, const std::string& extra) {
    const std::string arguments = tiny_run(TinyRun{.save = save, .micro_batch = 4 / ranks, .extra = flags + " " + extra});
    return ranks == 1 ? single(arguments) : launch(ranks, arguments);
  };
  const std::string whole = dir.path() + "/whole";
  const CommandResult uninterrupted = run(saver, whole, "--save-interval 2");
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const CommandResult resumed = run(resumer, dir.path() + "/resumed", "--load " + whole + "/iter_0000002");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("resumed from '{}/iter_0000002' at iteration 2 (8 samples consumed, saved "
                                            "by {} rank{})",
                                            whole, saver, saver == 1 ? "" : "s")),
            std::string::npos)
      << resumed.output;
  // The iterations after the resume log what the uninterrupted run logged.
  const std::vector<std::string> all = logged_numbers(uninterrupted.output), after = logged_numbers(resumed.output);
  ASSERT_EQ(after.size(), 2u * 4u + 1u) << resumed.output;  // iterations 3 and 4, validation at 4
  const auto tail = [](const std::vector<std::string>& numbers, size_t count) {
    return std::vector<std::string>(numbers.end() - static_cast<std::ptrdiff_t>(count), numbers.end());
  };
  std::string expected_text, got_text;
  for (const std::string& number : tail(all, after.size())) expected_text += number + " ";
  for (const std::string& number : after) got_text += number + " ";
  // Within rounding: the two runs sum their gradients over other numbers of ranks.
  for (size_t i = 0; i < after.size(); ++i) {
    const double a = value_of(tail(all, after.size())[i]), b = value_of(after[i]);
    EXPECT_NEAR(a, b, 1e-5 * std::max(1.0, std::fabs(a))) << expected_text << "\nvs\n" << got_text;
  }
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_LT(largest_difference(checkpoint(dir, "whole", file), checkpoint(dir, "resumed", file)), kRoundingBound)
        << file;
}

INSTANTIATE_TEST_SUITE_P(Sizes, CheckpointsAcrossSizes,
                         ::testing::Values(Resharding{4, 2, true}, Resharding{4, 1, true}, Resharding{1, 2, true},
                                           Resharding{2, 4, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.saver) + "_to_" + std::to_string(info.param.resumer) +
                                  (info.param.zero ? "_zero1" : "_replicated");
                         });

TEST(CheckpointsAcrossSizesErrors, ADataPositionTheNewSlicesCannotContinueIsNamed) {
  // 1 rank, global batch 6: 6 samples consumed after one step. 2 ranks of micro-batch 2 start
  // their slices at multiples of 4: resuming would skip or repeat samples, so it is refused.
  const TempDir dir;
  const CommandResult saved = single(tiny_run(TinyRun{.save = dir.path() + "/six", .train_iters = 1, .global_batch = 6}));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult resumed =
      launch(2, tiny_run(TinyRun{.save = dir.path() + "/resumed", .extra = "--load " + dir.path() + "/six",
                                 .train_iters = 3, .global_batch = 8}));
  EXPECT_NE(resumed.exit_code, 0);
  EXPECT_NE(resumed.output.find("stopped at 6 consumed samples, which micro-batches of 2 on 2 rank(s) (4 samples) "
                                "do not divide"),
            std::string::npos)
      << resumed.output;
}

TEST(DataParallelRestarts, ALauncherRestartAfterAKilledRankResumesFromTheLastCheckpoint) {
  // torchrun's --max-restarts story end to end: in the first attempt rank 1 dies (SIGKILL) once a
  // checkpoint exists; kiln launch ends the group and starts it again, and the same command
  // (--load is the --save folder) resumes from the last checkpoint and finishes.
  const TempDir dir;
  const std::string save = dir.path() + "/run";
  const std::string train = kiln_binary() + " " +
                            tiny_run(TinyRun{.save = save, .extra = "--load " + save + " --save-interval 2 --log-interval 100",
                                             .train_iters = 60, .eval_iters = 0});
  const CommandResult result = run_command(fmt::format(
      "OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node 2 --max-restarts 1 -- sh -c '"
      "if [ \"$KILN_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then "
      "(for i in $(seq 400); do [ -f {}/latest_checkpointed_iteration.txt ] && break; sleep 0.02; done; kill -9 $$) & "
      "fi; exec {}'",
      kiln_binary(), save, train));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("no checkpoint in '" + save + "' yet: starting from scratch"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("was killed by signal 9"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("restarting the workers (restart 1 of 1)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("resumed from '" + save + "' at iteration "), std::string::npos) << result.output;
  EXPECT_EQ(testing::read_file_bytes(save + "/latest_checkpointed_iteration.txt"), "60\n");
}

TEST(DataParallelBootstrap, RanksStartedByHandWithTorchrunVariablesTrainAsUnderLaunch) {
  const TempDir dir;
  const CommandResult launched = launch(2, tiny_run(dir.path() + "/launched", 2));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  const std::string port = std::to_string(20000 + ::getpid() % 5000);
  const std::string train = kiln_binary() + " " + tiny_run(dir.path() + "/by_hand", 2);
  const CommandResult by_hand = run_command(fmt::format("({} > /dev/null 2>&1 & {}; s=$?; wait $!; exit $s)",
                                                        rank_by_hand(1, port, train), rank_by_hand(0, port, train)));
  ASSERT_EQ(by_hand.exit_code, 0) << by_hand.output;
  EXPECT_EQ(logged_numbers(by_hand.output), logged_numbers(launched.output));
  EXPECT_EQ(largest_difference(checkpoint(dir, "launched", "model.safetensors"),
                               checkpoint(dir, "by_hand", "model.safetensors")),
            0.0);
}

// Two nodes as a multi-node job starts them: one `kiln launch --nnodes 2` per node, each with its
// --node-rank and node 0's address. Here both "nodes" are this machine; the ranks find each other
// through 127.0.0.1 only.
TEST(DataParallelBootstrap, TwoLaunchersAsTwoNodesTrainAsOneLauncherOfTwoRanks) {
  const TempDir dir;
  const CommandResult one_node = launch(2, tiny_run(dir.path() + "/one_node", 2));
  ASSERT_EQ(one_node.exit_code, 0) << one_node.output;
  const int port = dist::find_free_port();
  const auto node = [&](int node_rank) {
    return fmt::format(
        "OMP_NUM_THREADS=1 {} launch --nproc-per-node 1 --nnodes 2 --node-rank {} --master-addr 127.0.0.1 "
        "--master-port {} -- {} {}",
        kiln_binary(), node_rank, port, kiln_binary(), tiny_run(dir.path() + "/two_nodes", 2));
  };
  const CommandResult two_nodes = run_command(
      fmt::format("({} > {}/node1.log 2>&1 & {}; s=$?; wait $! || s=$?; exit $s)", node(1), dir.path(), node(0)));
  const std::string node_1_output = testing::read_file_bytes(dir.path() + "/node1.log");
  ASSERT_EQ(two_nodes.exit_code, 0) << two_nodes.output << "\nnode 1:\n" << node_1_output;
  EXPECT_EQ(logged_numbers(two_nodes.output), logged_numbers(one_node.output));
  EXPECT_EQ(largest_difference(checkpoint(dir, "one_node", "model.safetensors"),
                               checkpoint(dir, "two_nodes", "model.safetensors")),
            0.0);
  EXPECT_EQ(logged_numbers(node_1_output), std::vector<std::string>{})
      << "node 1's rank printed the log line, which rank 0 alone prints";
}

// examples/launch.sh run as its comments tell a user to, made short by flags after the layout:
// `cpu-2-nodes` on two "nodes" (NODE_RANK 0 and 1, node 0 at 127.0.0.1) trains what `cpu` trains
// on one node: 2 x 2 ranks of micro-batch 4 and 2 ranks of micro-batch 8, global batch 16 both.
TEST(DataParallelExamples, TheLaunchScriptsTwoNodeLayoutTrainsAsItsOneNodeLayout) {
  const TempDir dir;
  const std::string script = (kRepository / "examples" / "launch.sh").string();
  const std::string short_run =
      "--mock-data --vocab-size 257 --train-iters 2 --lr-warmup-iters 1 --eval-iters 1 --log-interval 1 "
      "--distributed-timeout-minutes 0.5";
  const CommandResult one_node = run_command(fmt::format("OMP_NUM_THREADS=1 KILN={} RUN={} {} cpu {}", kiln_binary(),
                                                         dir / "one_node", script, short_run));
  ASSERT_EQ(one_node.exit_code, 0) << one_node.output;
  const int port = dist::find_free_port();
  const auto node = [&](int node_rank) {
    return fmt::format("OMP_NUM_THREADS=1 KILN={} RUN={} NODE_RANK={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} {} "
                       "cpu-2-nodes {}",
                       kiln_binary(), dir / "two_nodes", node_rank, port, script, short_run);
  };
  const CommandResult two_nodes = run_command(
      fmt::format("({} > {} 2>&1 & {}; s=$?; wait $! || s=$?; exit $s)", node(1), dir / "node1.log", node(0)));
  ASSERT_EQ(two_nodes.exit_code, 0) << two_nodes.output << "\nnode 1:\n" << testing::read_file_bytes(dir / "node1.log");
  EXPECT_NE(one_node.output.find("micro 8 x data-parallel 2 x accumulation 1 = global 16"), std::string::npos)
      << one_node.output;
  EXPECT_NE(two_nodes.output.find("micro 4 x data-parallel 4 x accumulation 1 = global 16"), std::string::npos)
      << two_nodes.output;
  expect_same_log(one_node.output, two_nodes.output, kRoundingBound);
  // Adam divides by the gradient's running RMS: where a parameter's gradient nearly cancels over the
  // batch, the order of the sum moves it far more than it moves the gradient (6e-5 measured here, at
  // the demo's lr of 2e-3). Other data would move most parameters by about lr.
  EXPECT_LT(largest_difference(checkpoint(dir, "one_node", "model.safetensors", 2),
                               checkpoint(dir, "two_nodes", "model.safetensors", 2)),
            5e-4);
}

// The launch script's gpu layout (GPT-2 small's config, bf16, one worker per GPU over NCCL) cannot
// run here, but all of its command line but the device can: told `--device cpu` after the layout,
// it trains its two workers over Gloo from examples/gpt2-124m.yaml, made small by the flags after
// it, which win over the script's and the file's.
TEST(DataParallelExamples, TheLaunchScriptsGpuLayoutTrainsOnCpuRanksWhenTold) {
  const TempDir dir;
  const std::string script = (kRepository / "examples" / "launch.sh").string();
  const CommandResult result = run_command(fmt::format(
      "cd {} && OMP_NUM_THREADS=1 KILN={} RUN={} MASTER_PORT={} {} gpu --device cpu --mock-data --num-layers 2 "
      "--hidden-size 64 --num-attention-heads 2 --seq-length 32 --vocab-size 257 --micro-batch-size 2 "
      "--global-batch-size 8 --train-iters 2 --lr-warmup-iters 1 --lr-decay-iters 2 --eval-iters 1 --log-interval 1 "
      "--distributed-timeout-minutes 0.5",
      dir.path(), kiln_binary(), dir / "run", dist::find_free_port(), script));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("micro 2 x data-parallel 2 x accumulation 2 = global 8"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("| precision bf16 |"), std::string::npos) << result.output;  // the script's --bf16
  EXPECT_NE(result.output.find("model: GPT: 2 layers, hidden 64"), std::string::npos) << result.output;
  EXPECT_EQ(logged_numbers(result.output).size(), 4u * 2u + 1u) << result.output;  // rank 0 alone logs
  EXPECT_TRUE(std::filesystem::exists(dir / "run/iter_0000002/model.safetensors")) << result.output;
}

TEST(DataParallelBootstrap, RanksWithDifferentConfigurationsStopAtStartNamingTheKey) {
  const TempDir dir;
  // Rank 1 asks for another width: every rank stops before training, naming the key.
  const CommandResult result = run_command(fmt::format(
      "OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node 2 -- sh -c 'exec {} {}'", kiln_binary(), kiln_binary(),
      tiny_run(TinyRun{.save = dir.path() + "/mixed", .hidden_size = "$((32 + 32 * RANK))"})));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("rank 1 was started with another configuration than rank 0: hidden_size is '64' "
                               "there and '32' on rank 0"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("iteration"), std::string::npos) << result.output;
}

TEST(DataParallelBootstrap, DataParallelSizeThatIsNotTheWorldSizeIsAnError) {
  const TempDir dir;
  const CommandResult result = launch(2, tiny_run(dir.path() + "/wrong", 2, "--data-parallel-size 1"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("config key 'data_parallel_size' is 1 but the job has 2 rank(s)"), std::string::npos)
      << result.output;
}

class DataParallelFaults : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelFaults, ARankKilledMidRunStopsTheOthersNamingItAndTheLastCheckpointLoads) {
  // Ranks started by hand (no launcher to end the others): the victim is SIGKILLed once a
  // checkpoint exists; the survivor must notice by itself, name the victim and exit non-zero long
  // before the timeout. Rank 0 as the victim takes the rendezvous store with it.
  const int victim = GetParam(), survivor = 1 - victim;
  const TempDir dir;
  const std::string save = dir.path() + "/run";
  const std::string port = std::to_string(25000 + ::getpid() % 5000);
  const std::string train =
      kiln_binary() + " " +
      tiny_run(TinyRun{.save = save, .extra = "--save-interval 20", .train_iters = 100000, .eval_iters = 0});
  const auto rank = [&](int r) { return rank_by_hand(r, port, train); };
  const auto start = std::chrono::steady_clock::now();
  const CommandResult result = run_command(fmt::format(
      "({} > /dev/null 2>&1 & victim=$!; (for i in $(seq 400); do [ -f {}/latest_checkpointed_iteration.txt ] && "
      "break; sleep 0.05; done; kill -9 $victim) & {}; status=$?; wait; exit $status)",
      rank(victim), save, rank(survivor)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(fmt::format("on rank {} of 2 failed: lost rank {}", survivor, victim)), std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 20.0) << "the timeout is 30 s: a dead peer must be noticed by its closed connection";
  // The last checkpoint is whole: one rank resumes from it.
  const int saved = std::stoi(testing::read_file_bytes(save + "/latest_checkpointed_iteration.txt"));
  const CommandResult resumed = run_command(
      "OMP_NUM_THREADS=1 " + kiln_binary() + " " +
      tiny_run(TinyRun{.save = dir.path() + "/resumed", .extra = "--load " + save, .train_iters = saved + 2, .eval_iters = 0}));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
}

class DataParallelHang : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelHang, ARankThatStopsRespondingEndsTheOthersAtTheTimeoutNamingIt) {
  // SIGSTOP: the rank keeps its connections open, so only the timeout (0.05 min = 3 s) can tell,
  // and only its silence names it: the survivor posts that it failed and waits a grace of one
  // timeout for the other to do the same (lost_ranks). A stopped rank 0 cannot answer for the
  // rendezvous store it serves either.
  const int hung = GetParam(), survivor = 1 - hung;
  const TempDir dir;
  const std::string save = dir.path() + "/run";
  const std::string port = std::to_string(dist::find_free_port());
  const std::string train =
      kiln_binary() + " " +
      tiny_run(TinyRun{.save = save, .extra = "--save-interval 20 --distributed-timeout-minutes 0.05",
                       .train_iters = 100000, .eval_iters = 0});
  const auto rank = [&](int r) { return rank_by_hand(r, port, train); };
  const auto start = std::chrono::steady_clock::now();
  const CommandResult result = run_command(fmt::format(
      "({} > /dev/null 2>&1 & hung=$!; (for i in $(seq 400); do [ -f {}/latest_checkpointed_iteration.txt ] && "
      "break; sleep 0.05; done; kill -STOP $hung) & {}; status=$?; kill -9 $hung; wait; exit $status)",
      rank(hung), save, rank(survivor)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  const std::string culprit =
      hung == 1 ? "rank 1 did not answer within 3 s (hung, stopped, or slower than this rank by that much)"
                : "lost rank 0 (the rendezvous store it served is gone or does not answer)";
  EXPECT_NE(result.output.find(fmt::format("on rank {} of 2 failed: {}: ", survivor, culprit)), std::string::npos)
      << result.output;
  // Gloo's words: "Timed out" from its one-off collectives, "Read timeout" from the gradient
  // buckets' prepared ones.
  EXPECT_TRUE(result.output.find("Timed out") != std::string::npos ||
              result.output.find("Read timeout") != std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 25.0);
}

// Three ranks, the middle one stopped: both survivors time out, each posts that it failed, and each
// names rank 1 alone. Rank 2 must not blame rank 0, which has failed too and whose store may end
// with it while rank 2 still waits out its grace (lost_ranks, ~ProcessGroup).
TEST(DataParallelHangOfThree, EverySurvivorNamesTheStoppedRankAndNoOther) {
  const TempDir dir;
  const std::string save = dir.path() + "/run";
  const std::string port = std::to_string(dist::find_free_port());
  const std::string train =
      kiln_binary() + " " +
      tiny_run(TinyRun{.save = save, .micro_batch = 1, .extra = "--save-interval 20 --distributed-timeout-minutes 0.05",
                       .train_iters = 100000, .eval_iters = 0, .global_batch = 3});
  const auto rank = [&](int r) { return rank_by_hand(r, port, train, 3); };
  const std::string rank_2_log = dir.path() + "/rank_2.log";
  const CommandResult result = run_command(fmt::format(
      "({} > /dev/null 2>&1 & hung=$!; {} > {} 2>&1 & other=$!; (for i in $(seq 400); do [ -f "
      "{}/latest_checkpointed_iteration.txt ] && break; sleep 0.05; done; kill -STOP $hung) & {}; status=$?; "
      "wait $other; kill -9 $hung; wait; exit $status)",
      rank(1), rank(2), rank_2_log, save, rank(0)));
  EXPECT_NE(result.exit_code, 0) << result.output;
  const std::string blame = ": rank 1 did not answer within 3 s (hung, stopped, or slower than this rank by that much): ";
  EXPECT_NE(result.output.find("on rank 0 of 3 failed" + blame), std::string::npos) << result.output;
  const std::string rank_2 = testing::read_file_bytes(rank_2_log);
  EXPECT_NE(rank_2.find("on rank 2 of 3 failed" + blame), std::string::npos) << rank_2;
}

INSTANTIATE_TEST_SUITE_P(Hung, DataParallelHang, ::testing::Values(1, 0),
                         [](const auto& info) { return "rank_" + std::to_string(info.param) + "_stopped"; });

INSTANTIATE_TEST_SUITE_P(Victims, DataParallelFaults, ::testing::Values(1, 0),
                         [](const auto& info) { return "rank_" + std::to_string(info.param) + "_killed"; });

}  // namespace
}  // namespace kiln
