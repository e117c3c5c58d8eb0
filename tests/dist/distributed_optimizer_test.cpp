// ZeRO-1 (--use-distributed-optimizer) inside one process: two or three Trainers on threads, each
// a rank of one Gloo group over 127.0.0.1, so the per-rank buffers can be read directly and held
// against `kiln estimate`'s prediction (the training results are compared across real processes
// in data_parallel_test.cpp).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "kiln/perf/estimator.h"
#include "kiln/train/trainer.h"
#include "support/backends.h"
#include "support/error_of.h"
#include "support/gloo_ranks.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

Config tiny_config(bool bf16) {
  Config config = testing::tiny_mock_gpt_config("cpu");  // its odd vocabulary: the shards need padding
  config.global_batch_size = 12;
  config.train_iters = 2;
  config.bf16 = bf16;
  config.use_distributed_optimizer = true;
  return config;
}

// Runs body(trainer, rank) on `ranks` threads, each rank's Trainer on its own Gloo communicator.
void on_ranks(int ranks, const Config& config, const std::function<void(Trainer&, int)>& body) {
  testing::on_gloo_ranks(ranks, [&](GlooCommunicator& communicator) {
    Trainer trainer(config, &communicator);
    body(trainer, communicator.rank());
  });
}

class DistributedOptimizerMemory : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DistributedOptimizerMemory, EachRankHoldsTheShardKilnEstimatePredicts) {
  const auto [ranks, bf16] = GetParam();
  const Config config = tiny_config(bf16);
  on_ranks(ranks, config, [&](Trainer& trainer, int rank) {
    const int64_t parameters = trainer.model().num_parameters();
    const MemoryEstimate predicted =
        model_state_bytes(static_cast<double>(parameters), bf16 ? "bf16" : "fp32", 1, ranks);
    const AdamW& optimizer = trainer.optimizer();
    EXPECT_EQ(static_cast<double>(optimizer.state_bytes() + optimizer.master_bytes()), predicted.optimizer)
        << "rank " << rank << " of " << ranks;
    // The shards tile the padded buffer: rank r's starts at r x its size.
    EXPECT_EQ(optimizer.shard().begin, rank * optimizer.shard().count());
    EXPECT_EQ(optimizer.shard().count() * ranks, trainer.model().padded_params().numel());
    EXPECT_LT(trainer.model().padded_params().numel() - parameters, ranks);
    trainer.train_step();
    trainer.train_step();
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndPrecisions, DistributedOptimizerMemory,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_ranks_" +
                                  (std::get<1>(info.param) ? "bf16" : "fp32");
                         });

TEST(DistributedOptimizer, EveryRankEndsAStepWithTheSameParameters) {
  std::vector<std::vector<float>> parameters(3);
  on_ranks(3, tiny_config(false), [&](Trainer& trainer, int rank) {
    trainer.train_step();
    trainer.train_step();
    const Tensor params = trainer.model().params();
    parameters[static_cast<size_t>(rank)].assign(params.as<float>(), params.as<float>() + params.numel());
  });
  ASSERT_FALSE(parameters[0].empty());
  EXPECT_EQ(parameters[1], parameters[0]);
  EXPECT_EQ(parameters[2], parameters[0]);
}

// A launched process of one rank joins a group of one (ProcessPlace::joins_group) and takes the
// data-parallel path, buckets or ZeRO-1, which over one rank sums nothing: the very bits of the
// process alone. (The same over NCCL: nccl_communicator_test.cpp.)
TEST(DistributedOptimizer, AGroupOfOneEqualsTheProcessAlone) {
  for (const bool zero1 : {false, true}) {
    Config config = tiny_config(false);
    config.use_distributed_optimizer = zero1;
    config.global_batch_size = 4;
    config.ddp_bucket_size = 2000;
    const auto train = [&](Communicator* communicator) {
      Trainer trainer(config, communicator);
      std::vector<double> seen;
      for (int i = 0; i < 2; ++i) {
        const IterationStats stats = trainer.train_step();
        seen.push_back(stats.lm_loss);
        seen.push_back(stats.grad_norm);
      }
      const Tensor params = trainer.model().params();
      seen.insert(seen.end(), params.as<float>(), params.as<float>() + params.numel());
      return seen;
    };
    const std::vector<double> alone = train(nullptr);
    testing::on_gloo_ranks(1, [&](GlooCommunicator& communicator) {
      EXPECT_TRUE(train(&communicator) == alone) << (zero1 ? "ZeRO-1" : "buckets");
    });
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(CudaDevicePerRank, ALocalRankBeyondTheVisibleGpusIsNamed) {
  // Each rank runs on the GPU of its local rank; one without a GPU is told so before anything runs.
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  BackendOptions options;
  options.device_index = 64;
  EXPECT_NE(testing::error_of([&] { make_backend("cuda", options); })
                .find("--device cuda: GPU 64 (this rank's local rank) does not exist"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
