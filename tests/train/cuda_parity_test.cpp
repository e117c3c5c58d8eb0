// End to end on the GPU: 20 fp32 training steps of a small GPT on the CUDA back-end follow the
// CPU reference run's losses to a relative 1e-4. Skips with the reason where no GPU is usable.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/train/trainer.h"
#include "support/backends.h"
#include "support/small_gpt.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

// Trains `config` to the end; returns every iteration's statistics and, in `backend_notes`, what
// the back-end says it chose (Backend::run_notes).
std::vector<IterationStats> train_steps(const Config& config,
                                        std::string* backend_notes = nullptr) {
  Trainer trainer(config);
  struct Recorder : TrainObserver {
    void on_iteration(const IterationStats& stats) override { steps.push_back(stats); }
    std::vector<IterationStats> steps;
  } recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  if (backend_notes) *backend_notes = trainer.backend().run_notes();
  return recorder.steps;
}

std::vector<double> train_losses(const std::string& data, const std::string& device,
                                 const std::string& recompute = "none", bool pin_memory = true,
                                 bool h2d_stream = true) {
  Config config = testing::small_gpt_config(data, device);
  config.pin_memory = pin_memory;
  config.h2d_stream = h2d_stream;
  config.recompute_granularity = recompute;
  if (recompute == "full") config.recompute_method = "uniform";
  std::vector<double> losses;
  for (const IterationStats& step : train_steps(config)) losses.push_back(step.lm_loss);
  return losses;
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

// Hidden dropout draws the CPU reference's masks on the GPU (the same Philox bits): the losses
// follow the CPU's as closely as without it, differ from the run that drops nothing, and
// recomputation draws the masks again bit for bit.
TEST(CudaParity, HiddenDropoutFollowsTheCpuLossesAndRecomputesItsMasks) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  const auto losses = [&](const std::string& device, double hidden_dropout, const std::string& recompute) {
    Config config = testing::small_gpt_config(dir.path(), device);
    config.train_iters = 8;
    config.hidden_dropout = hidden_dropout;
    config.recompute_granularity = recompute;
    if (recompute == "full") config.recompute_method = "uniform";
    std::vector<double> values;
    for (const IterationStats& step : train_steps(config)) values.push_back(step.lm_loss);
    return values;
  };
  const std::vector<double> cpu = losses("cpu", 0.1, "none"), gpu = losses("cuda", 0.1, "none");
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "iteration " << i + 1;
  EXPECT_NE(losses("cpu", 0.0, "none").front(), cpu.front());
  EXPECT_EQ(losses("cuda", 0.1, "full"), gpu);
}

// The encoder classifier through the Trainer (key-padding attention, pooler, head, its default
// hidden and attention dropout): the CUDA back-end follows the CPU's losses, recomputes its masks
// bit for bit, and replays its micro-batches from CUDA graphs (dropout off) bit for bit.
TEST(CudaParity, EncoderClassifierFollowsTheCpuAndRecomputesAndReplays) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  const auto config_on = [](const std::string& device) {
    Config config;
    config.model = "encoder-classifier";
    config.device = device;
    config.mock_data = true;
    config.vocab_size = 61;
    config.num_layers = 2;
    config.hidden_size = 64;
    config.num_attention_heads = 2;
    config.num_intermediate_layers = 1;
    config.seq_length = 32;
    config.micro_batch_size = 4;
    config.global_batch_size = 8;
    config.train_iters = 6;
    config.lr = 1e-3;
    config.eval_iters = 0;
    config.num_workers = 0;
    return config;
  };
  const auto losses = [](const Config& config) {
    std::vector<double> values;
    for (const IterationStats& step : train_steps(config)) values.push_back(step.lm_loss);
    return values;
  };
  const std::vector<double> cpu = losses(config_on("cpu")), gpu = losses(config_on("cuda"));
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "iteration " << i + 1;
  Config recomputed = config_on("cuda");
  recomputed.recompute_granularity = "full";
  recomputed.recompute_method = "uniform";
  EXPECT_EQ(losses(recomputed), gpu);
  Config undropped = config_on("cuda");
  undropped.hidden_dropout = 0.0;
  undropped.attention_dropout = 0.0;
  Config graphed = undropped;
  graphed.cuda_graph = true;
  EXPECT_EQ(losses(graphed), losses(undropped));
}

// Replays from CUDA graphs run the same kernels on the same data as direct calls, so every loss
// agrees bit for bit. A graph replayed with another micro-batch's stager slot, or a capture not
// replayed, or replayed twice, changes the losses.
std::vector<IterationStats> train_steps(Config config, bool cuda_graph,
                                        std::string* backend_notes) {
  config.cuda_graph = cuda_graph;
  return train_steps(config, backend_notes);
}

TEST(CudaParity, CudaGraphReplaysGiveBitIdenticalLosses) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  const Config config = testing::small_gpt_config(dir.path(), "cuda");
  std::string direct_notes, graph_notes;
  const std::vector<IterationStats> direct = train_steps(config, false, &direct_notes);
  const std::vector<IterationStats> graphed = train_steps(config, true, &graph_notes);
  ASSERT_EQ(graphed.size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i) {
    EXPECT_EQ(graphed[i].lm_loss, direct[i].lm_loss) << "iteration " << i + 1;
    EXPECT_EQ(graphed[i].grad_norm, direct[i].grad_norm) << "iteration " << i + 1;
  }
  // 20 steps of 2 micro-batches, the first writing the gradients and the second adding (each on
  // its own stager slot): the first step's two run directly, the second step's are recorded, and
  // every one after those is a replay.
  EXPECT_NE(graph_notes.find("CUDA graphs: 2 captured, 38 replays"), std::string::npos)
      << graph_notes;
  EXPECT_EQ(direct_notes.find("CUDA graphs"), std::string::npos) << direct_notes;
}

TEST(CudaParity, CudaGraphsAreRecordedAgainWhenTheLossScaleChanges) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 61, 20000, 2000);
  Config config = testing::small_gpt_config(dir.path(), "cuda");
  config.fp16 = true;
  config.initial_loss_scale =
      1e12;  // overflows: skipped steps and a falling scale, as in MixedPrecision
  std::string direct_notes, graph_notes;
  const std::vector<IterationStats> direct = train_steps(config, false, &direct_notes);
  const std::vector<IterationStats> graphed = train_steps(config, true, &graph_notes);
  ASSERT_EQ(graphed.size(), direct.size());
  int64_t scale_changes = 0;
  for (size_t i = 0; i < direct.size(); ++i) {
    EXPECT_EQ(graphed[i].loss_scale, direct[i].loss_scale) << "iteration " << i + 1;
    EXPECT_EQ(graphed[i].skipped, direct[i].skipped) << "iteration " << i + 1;
    EXPECT_EQ(graphed[i].lm_loss, direct[i].lm_loss) << "iteration " << i + 1;
    scale_changes += i > 0 && direct[i].loss_scale != direct[i - 1].loss_scale;
  }
  ASSERT_GT(scale_changes, 2);
  EXPECT_NE(graph_notes.find(fmt::format("CUDA graphs: {} captured", 2 * (scale_changes + 1))),
            std::string::npos)
      << graph_notes << " (each scale is recorded once per stager slot)";
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

// The back-end's op scratch is reserved before the first step for the largest call the model
// makes (Gpt::workspace_needs): bf16 training steps allocate nothing beyond the plan. 512
// positions of 256 columns, so that the LayerNorm backward's partial sums (32 KiB) are the largest
// scratch, about twice the next (the embedding gradient's sort); when the attention backward adds
// dQ atomically its sums (512 KiB) are.
class CudaMemoryPlan : public ::testing::TestWithParam<bool> {};

TEST_P(CudaMemoryPlan, Bf16StepsAllocateNothingBeyondWhatWasPlanned) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  Config config = testing::small_gpt_config("", "cuda");
  config.deterministic_attention = GetParam();
  config.mock_data = true;
  config.vocab_size = 96;
  config.bf16 = true;
  config.hidden_size = 256;
  config.num_attention_heads = 4;
  config.seq_length = 64;
  config.micro_batch_size = 8;
  config.global_batch_size = 8;
  config.train_iters = 3;
  Trainer trainer(config);
  trainer.run();
  EXPECT_LE(trainer.backend().peak_allocated_bytes(), trainer.planned_device_bytes());
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaMemoryPlan, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "deterministic_attention" : "atomic_query_gradient";
                         });

}  // namespace
}  // namespace kiln
