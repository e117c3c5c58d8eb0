// Attention dropout (ops.h, AttentionDropout; GptConfig::attention_dropout): the op drops exactly
// the probabilities its Philox stream names, at its rate, scaling the rest; the whole model's
// gradient matches finite differences with the mask its draw fixes; training drops and evaluation
// does not; every recomputation method replays the masks bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/backend/registry.h"
#include "kiln/nn/gpt.h"
#include "support/directional_derivative.h"
#include "support/recomputation_check.h"
#include "support/token_batch.h"

namespace kiln {
namespace {

using Batch = testing::TokenBatch;
constexpr auto random_batch = testing::random_token_batch;
constexpr DropoutDraw kDraw{91, 4, 2};

// q = 0 makes every score equal, so P = 1 / T for every visible key; v's row k is the unit vector
// e_k, so out[b, t, k] = P Z = Z_tk / T: the op's output shows each element's mask factor.
TEST(AttentionDropoutOp, DropsTheElementsItsStreamNamesAtItsRate) {
  auto backend = make_backend("cpu");
  constexpr int64_t B = 4, T = 64, HS = 64;
  constexpr float kRate = 0.3f;
  std::vector<float> qkv(static_cast<size_t>(B * T * 3 * HS), 0.0f), out(static_cast<size_t>(B * T * HS));
  std::vector<float> lse(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < T; ++k) qkv[static_cast<size_t>((b * T + k) * 3 * HS + 2 * HS + k)] = 1.0f;
  const AttentionDropout dropout{kRate, 1234, 56};
  AttentionForward forward{Tensor{out.data(), Shape{B, T, HS}}, Tensor{lse.data(), Shape{B, 1, T}},
                           Tensor{qkv.data(), Shape{B, T, 3 * HS}}, {}, 1, AttentionMask::KeyPadding};
  std::vector<int32_t> all_keys(static_cast<size_t>(B * T), 1);
  forward.key_mask = Tensor{all_keys.data(), Shape{B, T}, DType::I32};
  forward.dropout = dropout;
  backend->attention_forward(forward);
  const DropoutMask mask = dropout_mask(kRate, dropout.seed, dropout.stream);
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < T; ++k) {
        const float expected = mask.factor(static_cast<uint64_t>((b * T + t) * T + k)) / static_cast<float>(T);
        const float got = out[static_cast<size_t>((b * T + t) * HS + k)];
        ASSERT_NEAR(got, expected, 1e-6f) << b << " " << t << " " << k;
        dropped += got == 0.0f;
      }
  // The lse is the undropped one: log(T) for scores of 0.
  EXPECT_NEAR(lse[5], std::log(static_cast<float>(T)), 1e-5f);
  const double count = static_cast<double>(B * T * T), share = static_cast<double>(dropped) / count;
  EXPECT_NEAR(share, kRate, 4.0 * std::sqrt(kRate * (1.0 - kRate) / count));  // four standard deviations
}

GptConfig attention_dropping(float attention_dropout, float hidden_dropout = 0.0f) {
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 24;
  config.num_heads = 2;
  config.vocab_size = 37;
  config.max_position_embeddings = 16;
  config.attention_dropout = attention_dropout;
  config.hidden_dropout = hidden_dropout;
  return config;
}

std::vector<float> gradients_of(Gpt& model) {
  return {model.grads().as<float>(), model.grads().as<float>() + model.num_parameters()};
}

TEST(GptAttentionDropout, GradientMatchesFiniteDifferencesWithTheMaskItsDrawFixes) {
  auto backend = make_backend("cpu");
  Gpt model(attention_dropping(0.2f), *backend);
  model.init_weights(1);
  model.allocate_activations(2, 8);
  const Batch batch = random_batch(2 * 7, 37, 2);
  model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f, {}, kDraw);
  model.backward();
  const std::vector<float> grads = gradients_of(model);
  const testing::DirectionalDerivative check = testing::directional_derivative(
      model.params().as<float>(), grads.data(), model.num_parameters(), [&] {
        return model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f, {}, kDraw);
      });
  EXPECT_NEAR(check.numeric, check.predicted, 5e-4 * std::abs(check.predicted)) << "numeric " << check.numeric;
}

TEST(GptAttentionDropout, TrainingDropsEvaluationDoesNotAndTheDrawNamesTheMasks) {
  auto backend = make_backend("cpu");
  Gpt plain(attention_dropping(0.0f), *backend), dropping(attention_dropping(0.3f), *backend);
  for (Gpt* model : {&plain, &dropping}) {
    model->init_weights(4);
    model->allocate_activations(2, 8);
  }
  const Batch batch = random_batch(16, 37, 5);
  const double evaluated = plain.forward(batch.tokens, batch.targets, 2, 8);
  EXPECT_EQ(dropping.forward(batch.tokens, batch.targets, 2, 8), evaluated) << "evaluation drops nothing";
  const double trained = dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw);
  EXPECT_NE(trained, evaluated);
  EXPECT_EQ(dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, kDraw), trained);
  for (const DropoutDraw other : {DropoutDraw{91, 5, 2}, DropoutDraw{92, 4, 2}, DropoutDraw{91, 4, 3}})
    EXPECT_NE(dropping.forward(batch.tokens, batch.targets, 2, 8, GradientPass::Write, 1.0f, {}, other), trained)
        << other.seed << " " << other.iteration << " " << other.micro_batch;
}

std::vector<float> dropped_gradients(const RecomputePolicy& recompute, double& loss) {
  auto backend = make_backend("cpu");
  GptConfig config = attention_dropping(0.25f, 0.1f);
  config.num_layers = 4;
  Gpt model(config, *backend);
  model.init_weights(3);
  model.allocate_activations(2, 16, recompute);
  const Batch batch = random_batch(32, 37, 4);
  loss = model.forward(batch.tokens, batch.targets, 2, 16, GradientPass::Write, 1.0f, {}, kDraw);
  model.backward();
  return gradients_of(model);
}

TEST(GptAttentionDropout, EveryRecomputationMethodGivesBitIdenticalGradients) {
  testing::expect_every_recomputation_bit_identical(dropped_gradients);
}

}  // namespace
}  // namespace kiln
