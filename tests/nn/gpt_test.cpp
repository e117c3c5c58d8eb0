// The assembled GPT: gradients of the whole model against finite differences, vocabulary padding,
// initialisation, and the parameter count against the closed formula of PERF.md.
#include "kiln/nn/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "support/device_tensors.h"
#include "support/directional_derivative.h"
#include "support/token_batch.h"

namespace kiln {
namespace {

GptConfig tiny_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 24;
  config.num_heads = 2;
  config.vocab_size = 37;
  config.max_position_embeddings = 8;
  return config;
}

using Batch = testing::TokenBatch;
constexpr auto random_batch = testing::random_token_batch;

TEST(Gpt, GradientMatchesDirectionalFiniteDifference) {
  auto backend = make_backend("cpu");
  const GptConfig config = tiny_config();
  Gpt model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(2, 8);
  const Batch batch = random_batch(2 * 7, config.vocab_size, 2);
  model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f);
  model.backward();
  const std::vector<float> grads(model.grads().as<float>(), model.grads().as<float>() + model.num_parameters());
  const testing::DirectionalDerivative check =
      testing::directional_derivative(model.params().as<float>(), grads.data(), model.num_parameters(),
                                      [&] { return model.forward(batch.tokens, batch.targets, 2, 7); });
  EXPECT_NEAR(check.numeric, check.predicted, 5e-4 * std::abs(check.predicted)) << "numeric " << check.numeric;
}

// A Write pass leaves what an Add pass into the zeroed gradients of a fresh model leaves, bit for
// bit, whatever the gradients held (NaN here); an Add pass after it doubles them.
TEST(Gpt, TheFirstMicroBatchWritesTheGradientsAndTheNextAdd) {
  auto backend = make_backend("cpu");
  const Batch batch = random_batch(6, 37, 4);
  const auto grads_of = [](const Gpt& model) {
    return std::vector<float>(model.grads().as<float>(), model.grads().as<float>() + model.num_parameters());
  };
  Gpt fresh(tiny_config(), *backend);
  fresh.init_weights(1);
  fresh.allocate_activations(1, 6);
  fresh.forward(batch.tokens, batch.targets, 1, 6, GradientPass::Add, 1.0f);
  fresh.backward();
  const std::vector<float> once = grads_of(fresh);

  Gpt model(tiny_config(), *backend);
  model.init_weights(1);
  model.allocate_activations(1, 6);
  std::fill_n(model.grads().as<float>(), model.num_parameters(), std::numeric_limits<float>::quiet_NaN());
  model.forward(batch.tokens, batch.targets, 1, 6, GradientPass::Write, 1.0f);
  model.backward();
  const std::vector<float> written = grads_of(model);
  ASSERT_EQ(0, std::memcmp(written.data(), once.data(), once.size() * sizeof(float)));
  model.forward(batch.tokens, batch.targets, 1, 6, GradientPass::Add, 1.0f);
  model.backward();
  for (int64_t i = 0; i < model.num_parameters(); ++i)
    ASSERT_FLOAT_EQ(model.grads().as<float>()[i], 2 * once[i]) << i;
}

TEST(Gpt, ClassifierChunksGiveTheLossesAndGradientsOfOneChunk) {
  // 14 positions in chunks of 5 (5 + 5 + 4) against all 14 at once. Not bit for bit: BLAS blocks
  // a 5-row product differently from a 14-row one, and wte's gradient is summed in another order;
  // equal to fp32 rounding.
  auto backend = make_backend("cpu");
  const GptConfig config = tiny_config();
  const Batch batch = random_batch(2 * 7, config.vocab_size, 6);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int64_t logit_rows : {int64_t{14}, int64_t{5}}) {
    Gpt model(config, *backend);
    model.init_weights(1);
    model.allocate_activations(2, 7, {}, logit_rows);
    losses.push_back(model.forward(batch.tokens, batch.targets, 2, 7, GradientPass::Write, 1.0f));
    model.backward();
    grads.emplace_back(model.grads().as<float>(), model.grads().as<float>() + model.num_parameters());
    EXPECT_EQ(model.logits_at(1, 6).size(), static_cast<size_t>(config.vocab_size));
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-6 * losses[0]);
  EXPECT_LT(testing::normalized_error(grads[1], grads[0]), 1e-6);
  // Only the chunk's logits are planned: 9 rows fewer of the padded vocabulary (1024 wide here, so
  // that the logits are the largest buffer of the stretch they share with d_fc, activations.h).
  GptConfig wide = config;
  wide.vocab_size = 1000;
  EXPECT_EQ(GptActivations::bytes_needed(wide, 2, 7, {}, DType::F32, 14) -
                GptActivations::bytes_needed(wide, 2, 7, {}, DType::F32, 5),
            (14 - 5) * 1024 * sizeof(float));
}

// With the classifier in fp8 (fp8_scaling.h) the chunks cast with the same scales, so chunks of 16
// positions give the losses, gradients and amax of one chunk of 64, up to the order of wte's
// gradient sums; each chunk's codes of the logits' gradient land in the same buffer. Chunk sizes
// the fp8 products cannot take are refused by name.
TEST(Gpt, Fp8ClassifierChunksGiveTheLossesAndGradientsOfOneChunk) {
  auto backend = make_backend("cpu");
  GptConfig config = tiny_config();
  config.hidden_size = 32;
  config.max_position_embeddings = 16;
  Fp8Recipe recipe;
  recipe.classifier = true;
  const Batch batch = random_batch(4 * 16, config.vocab_size, 8);
  struct Run {
    double loss;
    std::vector<float> grads, fp8_state;
  };
  const auto run = [&](int64_t logit_rows) {
    Gpt model(config, *backend, DType::BF16);
    model.enable_fp8(recipe);
    model.init_weights(3);
    model.allocate_activations(4, 16, {}, logit_rows);
    const double loss = model.forward(batch.tokens, batch.targets, 4, 16, GradientPass::Write, 1.0f);
    model.backward();
    return Run{loss, std::vector<float>(model.grads().as<float>(), model.grads().as<float>() + model.num_parameters()),
               model.fp8()->saved_state()};
  };
  const Run whole = run(64), chunked = run(16);
  EXPECT_NEAR(chunked.loss, whole.loss, 1e-6 * whole.loss);
  EXPECT_LT(testing::normalized_error(chunked.grads, whole.grads), 1e-5);
  EXPECT_EQ(chunked.fp8_state, whole.fp8_state) << "the same amax, whichever chunk saw it";

  Gpt model(config, *backend, DType::BF16);
  model.enable_fp8(recipe);
  std::string error;
  try {
    model.allocate_activations(4, 16, {}, 24);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("an fp8 classifier takes its positions in chunks of a multiple of 16"), std::string::npos)
      << error;
}

TEST(Gpt, LogitsAtFormsThePositionsLogits) {
  // logits_at after a forward without targets equals the row of a direct product ln_f(x) wte^T,
  // checked through the loss: -log softmax(logits)[target] is the forward's loss for one position.
  auto backend = make_backend("cpu");
  const GptConfig config = tiny_config();
  Gpt model(config, *backend);
  model.init_weights(2);
  model.allocate_activations(1, 6);
  const Batch batch = random_batch(6, config.vocab_size, 7);
  std::vector<int32_t> one_target(6, model.ignore_index());
  one_target[3] = batch.targets[3];
  const double loss = model.forward(batch.tokens, one_target, 1, 6);
  const std::vector<float> logits = model.logits_at(0, 3);
  double max_logit = logits[0], sum = 0;
  for (float value : logits) max_logit = std::max<double>(max_logit, value);
  for (float value : logits) sum += std::exp(value - max_logit);
  EXPECT_NEAR(std::log(sum) + max_logit - logits[static_cast<size_t>(batch.targets[3])], loss, 1e-5);
}

TEST(Gpt, VocabularyPaddingIsNeverPredictedNorTrained) {
  auto backend = make_backend("cpu");
  const GptConfig config = tiny_config();
  ASSERT_EQ(config.padded_vocab_size(), 64);
  Gpt model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(1, 5);
  const Batch batch = random_batch(5, config.vocab_size, 5);
  model.forward(batch.tokens, batch.targets, 1, 5, GradientPass::Write, 1.0f);
  model.backward();
  const ParameterInfo& wte = model.layout().find("wte.weight");
  const float* params = model.params().as<float>() + wte.offset;
  const float* grads = model.grads().as<float>() + wte.offset;
  for (int64_t i = config.vocab_size * config.hidden_size; i < wte.shape.numel(); ++i) {
    ASSERT_EQ(params[i], 0.0f);
    ASSERT_EQ(grads[i], 0.0f);
  }
  EXPECT_EQ(model.logits_at(0, 4).size(), static_cast<size_t>(config.vocab_size));
}

TEST(Gpt, InitialisationFollowsGpt2) {
  auto backend = make_backend("cpu");
  GptConfig config = tiny_config();
  config.num_layers = 8;
  config.hidden_size = 64;
  config.num_heads = 4;
  Gpt model(config, *backend);
  model.init_weights(1);
  auto stddev = [&](const std::string& name) {
    const ParameterInfo& info = model.layout().find(name);
    const float* values = model.params().as<float>() + info.offset;
    double squares = 0;
    for (int64_t i = 0; i < info.shape.numel(); ++i) squares += values[i] * values[i];
    return std::sqrt(squares / static_cast<double>(info.shape.numel()));
  };
  EXPECT_NEAR(stddev("h.0.mlp.c_fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(stddev("h.3.attn.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_EQ(model.params().as<float>()[model.layout().find("h.1.ln_2.weight").offset], 1.0f);
  EXPECT_EQ(model.params().as<float>()[model.layout().find("h.1.ln_2.bias").offset], 0.0f);
}

TEST(Gpt, ParameterCountMatchesClosedFormula) {
  // PERF.md: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), with V the (padded) vocabulary and s
  // the positions. GPT-2 124M: l=12, h=768, V=50304, s=1024.
  GptConfig config;
  config.num_layers = 12;
  config.hidden_size = 768;
  config.num_heads = 12;
  config.vocab_size = 50304;
  config.max_position_embeddings = 1024;
  const ParameterLayout layout(config);
  const double l = 12, h = 768, V = 50304, s = 1024;
  const double formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  // The closed form leaves out the final LayerNorm's gain and bias (2h).
  EXPECT_EQ(layout.total(), static_cast<int64_t>(std::llround(formula)) + 2 * 768);
  EXPECT_EQ(layout.total(), 124475904);  // nanoGPT's count for the same shape with V = 50304
}

TEST(Gpt, WeightDecaySegmentsSkipBiasesAndLayerNorm) {
  const ParameterLayout layout(tiny_config());
  for (const AdamwSegment& segment : layout.adamw_segments(0.1f)) {
    for (const ParameterInfo& info : layout.entries()) {
      if (info.offset >= segment.offset && info.offset < segment.offset + segment.count) {
        EXPECT_EQ(segment.weight_decay > 0, info.shape.rank == 2) << info.name;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
