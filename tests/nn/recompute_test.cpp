// Activation recomputation: every method gives bit-for-bit the gradients and losses of the run
// that keeps everything, and the activation plan's bytes match an independent count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "kiln/nn/gpt.h"
#include "kiln/train/trainer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;

GptConfig four_layers() {
  GptConfig config;
  config.num_layers = 4;
  config.hidden_size = 32;
  config.num_heads = 2;
  config.vocab_size = 50;
  config.max_position_embeddings = 16;
  return config;
}

RecomputePolicy policy(const std::string& granularity, const std::string& method = "", int64_t layers = 1) {
  return RecomputePolicy::parse(granularity, method, layers);
}

std::vector<RecomputePolicy> every_policy() {
  return {policy("full", "uniform", 1), policy("full", "uniform", 2), policy("full", "uniform", 3),
          policy("full", "uniform", 4), policy("full", "block", 1),   policy("full", "block", 3),
          policy("full", "block", 4),   policy("selective")};
}

std::vector<float> gradients_after_one_backward(const RecomputePolicy& recompute, double& loss) {
  auto backend = make_backend("cpu");
  Gpt model(four_layers(), *backend);
  model.init_weights(3);
  model.allocate_activations(2, 16, recompute);
  Rng rng(4);
  std::vector<int32_t> tokens(32), targets(32);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng.below(50));
    targets[i] = static_cast<int32_t>(rng.below(50));
  }
  loss = model.forward(tokens, targets, 2, 16, GradientPass::Write, 1.0f);
  model.backward();
  return {model.grads().as<float>(), model.grads().as<float>() + model.num_parameters()};
}

TEST(Recompute, EveryMethodGivesBitIdenticalGradients) {
  double reference_loss = 0;
  const std::vector<float> reference = gradients_after_one_backward(RecomputePolicy{}, reference_loss);
  for (const RecomputePolicy& recompute : every_policy()) {
    double loss = 0;
    const std::vector<float> grads = gradients_after_one_backward(recompute, loss);
    EXPECT_EQ(loss, reference_loss) << recompute.describe();
    ASSERT_EQ(grads.size(), reference.size());
    EXPECT_EQ(std::memcmp(grads.data(), reference.data(), grads.size() * sizeof(float)), 0) << recompute.describe();
  }
}

TEST(Recompute, TrainingRunsAreBitIdenticalWithEveryMethod) {
  testing::TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  auto losses_with = [&](const std::string& granularity, const std::string& method, int64_t layers) {
    Config config;
    config.data_path = dir.path();
    config.num_layers = 4;
    config.hidden_size = 32;
    config.num_attention_heads = 2;
    config.seq_length = 16;
    config.micro_batch_size = 4;
    config.global_batch_size = 8;
    config.train_iters = 5;
    config.lr = 1e-2;
    config.eval_iters = 0;
    config.recompute_granularity = granularity;
    config.recompute_method = method;
    config.recompute_num_layers = layers;
    Trainer trainer(config);
    struct : TrainObserver {
      void on_iteration(const IterationStats& stats) override { losses.push_back(stats.lm_loss); }
      std::vector<double> losses;
    } recorder;
    trainer.add_observer(&recorder);
    trainer.run();
    return recorder.losses;
  };
  const std::vector<double> reference = losses_with("none", "", 1);
  EXPECT_EQ(losses_with("full", "uniform", 2), reference);
  EXPECT_EQ(losses_with("full", "block", 3), reference);
  EXPECT_EQ(losses_with("selective", "", 1), reference);
}

TEST(Recompute, PlanBytesMatchAnIndependentCount) {
  // Every tensor below is a multiple of 256 bytes, so the arena's alignment adds nothing.
  const GptConfig config = four_layers();
  const int64_t B = 4, T = 16, C = 32, NH = 2, L = 4, Vp = 64;
  const int64_t BT = B * T, BTC = BT * C, lse = NH * B * T;
  const int64_t block = 16 * BTC + 4 * BT + lse;  // ln1, stats, qkv, attn_out, lse, residuals, ln2, MLP
  const int64_t shared = std::max({BTC /* projection */, BT * Vp /* logits */, 3 * BTC /* d_qkv */, 4 * BTC /* d_fc */});
  const int64_t outside = 2 * BT /* int32 tokens, targets */ + BTC /* embedded */ + BTC + 2 * BT /* ln_f */ +
                          BT /* losses */ + BTC + BTC /* d_residual, d_hidden */ + shared;
  auto bytes = [&](const RecomputePolicy& recompute) {
    return static_cast<int64_t>(GptActivations::bytes_needed(config, B, T, recompute));
  };
  EXPECT_EQ(bytes(RecomputePolicy{}), 4 * (outside + L * block));
  // Full, chunks of 1: one scratch block; every layer keeps only its output.
  EXPECT_EQ(bytes(policy("full", "uniform", 1)), 4 * (outside + block + L * BTC));
  // Full, chunks of 2: two scratch blocks; the last layer of each chunk keeps its output.
  EXPECT_EQ(bytes(policy("full", "uniform", 2)), 4 * (outside + 2 * block + 2 * BTC));
  // Block, first 3: one scratch block, 3 kept outputs, 1 full layer.
  EXPECT_EQ(bytes(policy("full", "block", 3)), 4 * (outside + block + 3 * BTC + block));
  // Selective: every layer's GELU output (4C per position) is one shared buffer.
  EXPECT_EQ(bytes(policy("selective")), 4 * (outside + L * (block - 4 * BTC) + 4 * BTC));
}

TEST(Recompute, ConfigValidationAndTheOlderSpelling) {
  Config config;
  config.activations_checkpoint_method = "uniform";
  config.resolve();
  EXPECT_EQ(config.recompute_granularity, "full");
  EXPECT_EQ(config.recompute_method, "uniform");
  config.validate();

  Config missing;
  missing.recompute_granularity = "full";
  missing.resolve();
  EXPECT_NE(error_of([&] { missing.validate(); }).find("needs a method"), std::string::npos);

  Config too_many;
  too_many.recompute_granularity = "full";
  too_many.recompute_method = "block";
  too_many.recompute_num_layers = 9;
  too_many.resolve();
  EXPECT_NE(error_of([&] { too_many.validate(); }).find("'recompute_num_layers': 9 exceeds"), std::string::npos);

  Config unknown;
  unknown.recompute_granularity = "partial";
  unknown.resolve();
  EXPECT_NE(error_of([&] { unknown.validate(); }).find("'recompute_granularity': 'partial'"), std::string::npos);
}

}  // namespace
}  // namespace kiln
