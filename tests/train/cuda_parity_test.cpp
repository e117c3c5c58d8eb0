// End to end on the GPU: 20 fp32 training steps of a small GPT on the CUDA back-end follow the
// CPU reference run's losses to a relative 1e-4. Skips with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/train/trainer.h"
#include "support/backends.h"
#include "support/small_gpt.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

class LossRecorder : public TrainObserver {
 public:
  void on_iteration(const IterationStats& stats) override { losses.push_back(stats.lm_loss); }
  std::vector<double> losses;
};

std::vector<double> train_losses(const std::string& data, const std::string& device,
                                 const std::string& recompute = "none", bool pin_memory = true,
                                 bool h2d_stream = true) {
  Config config = testing::small_gpt_config(data, device);
  config.pin_memory = pin_memory;
  config.h2d_stream = h2d_stream;
  config.recompute_granularity = recompute;
  if (recompute == "full") config.recompute_method = "uniform";
  Trainer trainer(config);
  LossRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  return recorder.losses;
}

TEST(CudaParity, Fp32TrainingFollowsTheCpuLosses) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  const std::vector<double> cpu = train_losses(dir.path(), "cpu");
  const std::vector<double> gpu = train_losses(dir.path(), "cuda");
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "iteration " << i + 1;
  EXPECT_LT(cpu.back(), cpu.front() - 0.5);
}

TEST(CudaParity, BatchStagingModesGiveBitIdenticalLosses) {
  // Pinned + copy stream (the default), pinned on the compute stream, pageable + copy stream: the
  // same batches reach the same kernels, so the losses agree bit for bit. A missing event wait
  // would let a kernel read a slot mid-copy and break this.
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  const std::vector<double> staged = train_losses(dir.path(), "cuda");
  EXPECT_EQ(train_losses(dir.path(), "cuda", "none", true, false), staged);
  EXPECT_EQ(train_losses(dir.path(), "cuda", "none", false, true), staged);
}

TEST(CudaParity, RecomputationOnTheGpuIsBitIdentical) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  const std::vector<double> none = train_losses(dir.path(), "cuda");
  EXPECT_EQ(train_losses(dir.path(), "cuda", "full"), none);
  EXPECT_EQ(train_losses(dir.path(), "cuda", "selective"), none);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(CudaMemory, APlanThatCannotFitFailsBeforeTheFirstStepWithBytesPerCategory) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  Config config;
  config.device = "cuda";
  config.mock_data = true;
  config.vocab_size = 50257;
  config.num_layers = 12;
  config.hidden_size = 768;
  config.num_attention_heads = 12;
  config.seq_length = 1024;
  config.micro_batch_size = 512;  // about 0.8 TB of activations
  config.eval_iters = 0;
  try {
    Trainer trainer(config);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* part : {"not enough memory on", "parameters", "gradients", "optimizer state", "activations",
                             "op workspace",
                             "GiB are free", "--micro-batch-size"})
      EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
  }
}

}  // namespace
}  // namespace kiln
