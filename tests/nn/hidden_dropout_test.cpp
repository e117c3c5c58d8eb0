// GPT's hidden dropout (GptConfig::hidden_dropout, block.h BranchDropout, nn/dropout_streams.h):
// the gradient of the whole model against finite differences with the mask fixed by its draw;
// masks drawn again by the backward and by every recomputation method (bit for bit); a training
// forward drops and an evaluation forward does not; the draw names the mask; the deferred
// embedding lookup (data parallelism) sees the dropped embedding gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/backend/registry.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/nn/gpt.h"
#include "support/directional_derivative.h"
#include "support/recomputation_check.h"
#include "support/token_batch.h"

namespace kiln {
namespace {

GptConfig dropping_config(float hidden_dropout) {
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 24;
  config.num_heads = 2;
  config.vocab_size = 37;
  config.max_position_embeddings = 8;
  config.hidden_dropout = hidden_dropout;
  return config;
}

using Batch = testing::TokenBatch;
constexpr auto random_batch = testing::random_token_batch;

constexpr DropoutDraw kDraw{77, 5, 3};

std::vector<float> gradients_of(Gpt& model) {
  return {model.grads().as<float>(), model.grads().as<float>() + model.num_parameters()};
}

// With a fixed draw the training loss is a smooth function of the parameters almost everywhere
// (the mask does not move with them): along a random direction its finite difference is g . d.
TEST(GptHiddenDropout, GradientMatchesFiniteDifferencesWithTheMaskItsDrawFixes) {
  auto backend = make_backend("cpu");
  Gpt model(dropping_config(0.2f), *backend);
  model.init_weights(1);
  model.allocate_activations(2, 8);
  const Batch batch = random_batch(2 * 7, 37, 2);
  model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f, {}, kDraw);
  model.backward();
  const std::vector<float> grads = gradients_of(model);
  const testing::DirectionalDerivative check = testing::directional_derivative(
      model.params().as<float>(), grads.data(), model.num_parameters(), [&] {  // the same draw, so the same masks
        return model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f, {}, kDraw);
      });
  EXPECT_NEAR(check.numeric, check.predicted, 5e-4 * std::abs(check.predicted)) << "numeric " << check.numeric;
}

TEST(GptHiddenDropout, TrainingForwardsDropAndEvaluationDoesNot) {
  auto backend = make_backend("cpu");
  Gpt plain(dropping_config(0.0f), *backend), dropping(dropping_config(0.3f), *backend);
  for (Gpt* model : {&plain, &dropping}) {
    model->init_weights(4);
    model->allocate_activations(2, 8);
  }
  const Batch batch = random_batch(16, 37, 5);
  const double evaluated = plain.forward(batch.tokens, batch.targets, 2, 8);
  EXPECT_EQ(dropping.forward(batch.tokens, batch.targets, 2, 8), evaluated) << "evaluation drops nothing";
  EXPECT_EQ(plain.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw), evaluated)
      << "a rate of 0 drops nothing";
  const double trained = dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw);
  EXPECT_NE(trained, evaluated);
  // The draw alone names the masks: the same draw again, the same loss; another iteration, seed or
  // micro-batch, another.
  EXPECT_EQ(dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw), trained);
  for (const DropoutDraw other : {DropoutDraw{77, 6, 3}, DropoutDraw{78, 5, 3}, DropoutDraw{77, 5, 4}})
    EXPECT_NE(dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, other), trained)
        << other.seed << " " << other.iteration << " " << other.micro_batch;
}

std::vector<float> dropped_gradients(const RecomputePolicy& recompute, double& loss) {
  auto backend = make_backend("cpu");
  GptConfig config = dropping_config(0.25f);
  config.num_layers = 4;
  config.max_position_embeddings = 16;
  Gpt model(config, *backend);
  model.init_weights(3);
  model.allocate_activations(2, 16, recompute);
  const Batch batch = random_batch(32, 37, 4);
  loss = model.forward(batch.tokens, batch.targets, 2, 16, GradientPass::Write, 1.0f, {}, kDraw);
  model.backward();
  return gradients_of(model);
}

// The recomputed blocks draw their forward's masks again: the gradients of every method are the
// bits of the run that keeps everything.
TEST(GptHiddenDropout, EveryRecomputationMethodGivesBitIdenticalGradients) {
  testing::expect_every_recomputation_bit_identical(dropped_gradients);
}

// Data parallelism's deferred lookup adds what the backward would have: the embedding output's
// gradient it hands out is already through the embedding's dropout.
TEST(GptHiddenDropout, TheDeferredEmbeddingLookupAddsTheDroppedGradient) {
  auto backend = make_backend("cpu");
  Gpt model(dropping_config(0.3f), *backend);
  model.init_weights(6);
  model.allocate_activations(2, 8);
  const Batch batch = random_batch(16, 37, 7);
  model.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw);
  model.backward();
  const std::vector<float> whole = gradients_of(model);
  model.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw);
  model.defer_embedding_lookup();
  model.backward();
  Tensor tokens{const_cast<int32_t*>(batch.tokens.data()), Shape{2, 8}, DType::I32, Device::CPU};
  model.add_embedding_lookup(model.embedding_output_gradient(), tokens);
  const std::vector<float> deferred = gradients_of(model);
  ASSERT_EQ(deferred.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_NEAR(deferred[i], whole[i], 1e-6f * (1 + std::abs(whole[i]))) << i;
}

TEST(GptHiddenDropout, ARateOutsideZeroToOneIsRefusedByName) {
  auto backend = make_backend("cpu");
  for (const float rate : {1.0f, -0.1f, NAN}) {
    try {
      Gpt model(dropping_config(rate), *backend);
      ADD_FAILURE() << "rate " << rate << " accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("hidden_dropout must be in [0, 1)"), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace kiln
