// The encoder classifier (nn/encoder_classifier.h): the whole model's gradient against finite
// differences (dropout off, and on with the mask its draw fixes), padding that changes nothing,
// the write-then-add gradient passes, the parameter count, predictions, a tiny task it learns,
// bad input named, and the CUDA back-end against the CPU's (on the emulator in CI).
#include "kiln/nn/encoder_classifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/registry.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/optim/adamw.h"
#include "support/backends.h"
#include "support/directional_derivative.h"
#include "support/error_of.h"

namespace kiln {
namespace {

using testing::error_of;

EncoderConfig tiny_encoder(float dropout = 0.0f) {
  EncoderConfig config;
  config.num_layers = 2;
  config.hidden_size = 24;
  config.num_heads = 2;
  config.vocab_size = 37;
  config.max_position_embeddings = 8;
  config.num_intermediate_layers = 2;
  config.num_labels = 3;
  config.hidden_dropout = dropout;  // and the attention's probabilities at the same rate
  config.attention_dropout = dropout;
  return config;
}

// Samples of random lengths in [2, seq], padded with token 0 (mask 0), with random labels.
struct Samples {
  std::vector<int32_t> ids, mask, labels;
  ClassificationBatch batch() const { return {ids, mask, labels}; }
};

Samples random_samples(int64_t count, int64_t seq, const EncoderConfig& config, uint64_t seed) {
  Rng rng(seed);
  Samples samples;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t length = 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(seq - 1)));
    for (int64_t t = 0; t < seq; ++t) {
      samples.ids.push_back(t < length ? static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))) : 0);
      samples.mask.push_back(t < length ? 1 : 0);
    }
    samples.labels.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.num_labels))));
  }
  return samples;
}

std::vector<float> gradients_of(const EncoderClassifier& model) {
  return {model.grads().as<float>(), model.grads().as<float>() + model.num_parameters()};
}

constexpr DropoutDraw kDraw{11, 2, 1};

// Along a random direction d: (L(p + h d) - L(p - h d)) / 2h must equal g . d (Richardson's
// extrapolation of two steps, as gpt_test.cpp). With dropout the loss is a training forward's,
// under the same draw, so the same masks.
void expect_gradient_matches_finite_differences(float dropout) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder(dropout);
  EncoderClassifier model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(3, 7);
  const Samples samples = random_samples(3, 7, config, 2);
  const GradientPass pass = dropout > 0 ? GradientPass::Write : GradientPass::None;
  model.forward(samples.batch(), 3, 7, GradientPass::Write, 1.0f, kDraw);
  model.backward();
  const std::vector<float> grads = gradients_of(model);
  const ParameterInfo& types = model.layout().find("embeddings.token_type_embeddings.weight");
  const testing::DirectionalDerivative check = testing::directional_derivative(
      model.params().as<float>(), grads.data(), model.num_parameters(),
      [&] { return model.forward(samples.batch(), 3, 7, pass, 1.0f, kDraw); }, 3, 8e-4,
      [&](int64_t i) { return i >= types.offset && i < types.offset + types.shape.numel(); });
  EXPECT_NEAR(check.numeric, check.predicted, 5e-4 * std::abs(check.predicted)) << "numeric " << check.numeric;
}

TEST(EncoderClassifier, GradientMatchesFiniteDifferences) { expect_gradient_matches_finite_differences(0.0f); }

TEST(EncoderClassifier, GradientMatchesFiniteDifferencesWithTheMaskItsDrawFixes) {
  expect_gradient_matches_finite_differences(0.2f);
}

// Every token is of type 0: row 0 of the token-type embeddings is added at every position and
// row 1 nowhere. So moving row 0 by v is moving every position's embedding by v: the table is
// redundant with the positions' and is held, its gradient zero (encoder_classifier.h). (The
// finite-difference tests above hold it still and move every other parameter.)
TEST(EncoderClassifier, TokenTypeZeroIsAddedEverywhereAndTheTypesTableIsHeld) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  const int64_t C = config.hidden_size, P = config.max_position_embeddings, B = 3, T = 7;
  EncoderClassifier model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(B, T);
  const Samples samples = random_samples(B, T, config, 2);
  const double loss = model.forward(samples.batch(), B, T, GradientPass::Write);
  model.backward();
  const ParameterInfo& type_table = model.layout().find("embeddings.token_type_embeddings.weight");
  EXPECT_FALSE(type_table.weight_decay);
  const int64_t types = type_table.offset;
  const int64_t positions = model.layout().find("embeddings.position_embeddings.weight").offset;
  const float* grads = model.grads().as<float>();
  for (int64_t i = 0; i < 2 * C; ++i) EXPECT_EQ(grads[types + i], 0.0f) << "element " << i << " of the types' table";
  for (int64_t t = 0; t < T; ++t) EXPECT_NE(grads[positions + t * C], 0.0f) << "position " << t;
  for (int64_t t = T; t < P; ++t) EXPECT_EQ(grads[positions + t * C], 0.0f) << "position " << t;
  float* params = model.params().as<float>();
  const std::vector<float> saved(params, params + model.num_parameters());
  params[types + C] += 1.0f;
  EXPECT_EQ(model.forward(samples.batch(), B, T), loss) << "row 1 is read nowhere";
  Rng rng(3);
  std::vector<float> v(static_cast<size_t>(C));
  for (float& x : v) x = rng.normal(0.0f, 0.05f);
  for (int64_t c = 0; c < C; ++c) params[types + c] += v[static_cast<size_t>(c)];
  const double moved = model.forward(samples.batch(), B, T);
  EXPECT_GT(std::abs(moved - loss), 1e-4) << "row 0 is read";
  std::copy(saved.begin(), saved.end(), params);
  for (int64_t t = 0; t < P; ++t)
    for (int64_t c = 0; c < C; ++c) params[positions + t * C + c] += v[static_cast<size_t>(c)];
  EXPECT_NEAR(model.forward(samples.batch(), B, T), moved, 1e-6) << "as every position moved";
}

// Recomputation (block_stack.h) replays the blocks' very ops, dropout masks included: every policy
// gives the gradients of the model that keeps everything, bit for bit, and takes less memory.
TEST(EncoderClassifier, EveryRecomputationPolicyGivesTheSameGradientsWithDropout) {
  auto backend = make_backend("cpu");
  EncoderConfig config = tiny_encoder(0.2f);
  config.num_layers = 4;
  const Samples samples = random_samples(3, 7, config, 5);
  const auto gradients_with = [&](const RecomputePolicy& policy, size_t* bytes) {
    EncoderClassifier model(config, *backend);
    model.init_weights(3);
    model.allocate_activations(3, 7, policy);
    *bytes = model.activation_bytes();
    const double loss = model.forward(samples.batch(), 3, 7, GradientPass::Write, 1.0f, kDraw);
    model.backward();
    std::vector<float> grads = gradients_of(model);
    grads.push_back(static_cast<float>(loss));
    return grads;
  };
  size_t kept_bytes = 0;
  const std::vector<float> kept = gradients_with({}, &kept_bytes);
  for (const RecomputePolicy& policy :
       {RecomputePolicy::parse("selective", "", 1), RecomputePolicy::parse("full", "uniform", 1),
        RecomputePolicy::parse("full", "uniform", 2), RecomputePolicy::parse("full", "block", 3)}) {
    size_t bytes = 0;
    EXPECT_EQ(gradients_with(policy, &bytes), kept) << policy.describe();
    EXPECT_LT(bytes, kept_bytes) << policy.describe();
    EXPECT_EQ(bytes, EncoderActivations::bytes_needed(config, 3, 7, DType::F32, policy)) << policy.describe();
  }
}

TEST(EncoderClassifier, TrainingForwardsDropAndEvaluationDoesNot) {
  auto backend = make_backend("cpu");
  EncoderClassifier plain(tiny_encoder(0.0f), *backend), dropping(tiny_encoder(0.3f), *backend);
  for (EncoderClassifier* model : {&plain, &dropping}) {
    model->init_weights(4);
    model->allocate_activations(3, 8);
  }
  const Samples samples = random_samples(3, 8, tiny_encoder(), 13);
  const double evaluated = plain.forward(samples.batch(), 3, 8);
  EXPECT_EQ(dropping.forward(samples.batch(), 3, 8), evaluated) << "evaluation drops nothing";
  EXPECT_EQ(plain.forward(samples.batch(), 3, 8, GradientPass::Write, 1.0f, kDraw), evaluated);
  const double trained = dropping.forward(samples.batch(), 3, 8, GradientPass::Write, 1.0f, kDraw);
  EXPECT_NE(trained, evaluated);
  EXPECT_EQ(dropping.forward(samples.batch(), 3, 8, GradientPass::Write, 1.0f, kDraw), trained);
  EXPECT_NE(dropping.forward(samples.batch(), 3, 8, GradientPass::Write, 1.0f, DropoutDraw{11, 3, 1}), trained);
  // The logits of a training forward are gone: its loss wrote their gradient over them.
  EXPECT_NE(error_of([&] { dropping.predictions(); }).find("wrote the logits' gradient"), std::string::npos);
}

// Padded positions are masked as keys and never pooled: what they hold changes nothing.
TEST(EncoderClassifier, WhatThePaddingHoldsChangesNothing) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  EncoderClassifier model(config, *backend);
  model.init_weights(4);
  model.allocate_activations(4, 8);
  Samples samples = random_samples(4, 8, config, 5);
  const double loss = model.forward(samples.batch(), 4, 8);
  const std::vector<float> logits = model.logits();
  for (size_t i = 0; i < samples.ids.size(); ++i)
    if (samples.mask[i] == 0) samples.ids[i] = static_cast<int32_t>((i * 7) % 37);
  EXPECT_EQ(model.forward(samples.batch(), 4, 8), loss);
  EXPECT_EQ(model.logits(), logits);
  // A real token does change it.
  samples.ids[1] = (samples.ids[1] + 1) % 37;
  EXPECT_NE(model.forward(samples.batch(), 4, 8), loss);
}

// A CPU back-end that keeps what the pooler reads, the final hidden states (gather_rows' input),
// and the gradient the final LayerNorm's backward reads (the one with the gain at `final_gain`);
// with `masks` false it skips the zeroing of padded rows (the encoder's mask_rows, in place).
class FinalStatesWatcher final : public CpuBackend {
 public:
  void gather_rows(const GatherRows& args) override {
    CpuBackend::gather_rows(args);
    hidden.assign(args.in.as<float>(), args.in.as<float>() + args.in.numel());
  }
  void layernorm_backward(const LayerNormBackward& args) override {
    if (args.weight.data == final_gain) gradient.assign(args.dout.as<float>(), args.dout.as<float>() + args.dout.numel());
    CpuBackend::layernorm_backward(args);
  }
  void mask_rows(const MaskRows& args) override {
    ASSERT_EQ(args.out.data, args.in.data) << "the encoder masks in place";
    if (masks) CpuBackend::mask_rows(args);
  }
  const void* final_gain = nullptr;
  bool masks = true;
  std::vector<float> hidden, gradient;  // [B, T, C] each
};

// The final hidden states are exactly 0 at padded positions, and so is the gradient that reaches
// them; at real positions they are not.
TEST(EncoderClassifier, FinalHiddenStatesAndTheirGradientAreZeroAtPaddedPositions) {
  FinalStatesWatcher backend;
  const EncoderConfig config = tiny_encoder(0.2f);
  const int64_t B = 4, T = 8, C = config.hidden_size;
  EncoderClassifier model(config, backend);
  model.init_weights(5);
  model.allocate_activations(B, T);
  backend.final_gain = model.layout().view(model.params(), "final_layer_norm.weight").data;
  const Samples samples = random_samples(B, T, config, 7);
  ASSERT_NE(std::count(samples.mask.begin(), samples.mask.end(), 0), 0) << "the samples need padding";
  model.forward(samples.batch(), B, T, GradientPass::Write, 1.0f, kDraw);
  model.backward();
  ASSERT_EQ(backend.hidden.size(), static_cast<size_t>(B * T * C));
  ASSERT_EQ(backend.gradient.size(), backend.hidden.size());
  for (int64_t position = 0; position < B * T; ++position) {
    const auto row = backend.hidden.begin() + position * C;
    const auto row_gradient = backend.gradient.begin() + position * C;
    if (samples.mask[static_cast<size_t>(position)] == 0) {
      EXPECT_TRUE(std::all_of(row, row + C, [](float h) { return h == 0.0f; })) << "padded position " << position;
      EXPECT_TRUE(std::all_of(row_gradient, row_gradient + C, [](float g) { return g == 0.0f; }))
          << "padded position " << position;
    } else {
      EXPECT_FALSE(std::all_of(row, row + C, [](float h) { return h == 0.0f; })) << "real position " << position;
    }
  }
}

// Only the first position, always real, reaches the loss: with the padding zeroed or not, the
// loss, the logits and every gradient are the same bits, with padding and without, dropout on.
TEST(EncoderClassifier, ZeroingThePaddingChangesNoLossLogitOrGradient) {
  const EncoderConfig config = tiny_encoder(0.2f);
  const int64_t B = 4, T = 8;
  Samples padded = random_samples(B, T, config, 8), unpadded = padded;
  std::fill(unpadded.mask.begin(), unpadded.mask.end(), 1);
  for (const Samples* samples : {&padded, &unpadded}) {
    const auto run = [&](bool masks) {
      FinalStatesWatcher backend;
      backend.masks = masks;
      EncoderClassifier model(config, backend);
      model.init_weights(6);
      model.allocate_activations(B, T);
      model.forward(samples->batch(), B, T);
      std::vector<float> results = model.logits();
      results.push_back(static_cast<float>(model.forward(samples->batch(), B, T, GradientPass::Write, 1.0f, kDraw)));
      model.backward();
      const std::vector<float> grads = gradients_of(model);
      results.insert(results.end(), grads.begin(), grads.end());
      return results;
    };
    EXPECT_EQ(run(true), run(false)) << (samples == &padded ? "padded" : "unpadded");
  }
}

TEST(EncoderClassifier, AWritingPassLeavesWhatAddingIntoZerosDoesAndAnAddingPassAdds) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  const Samples samples = random_samples(2, 6, config, 6);
  EncoderClassifier fresh(config, *backend);
  fresh.init_weights(1);
  fresh.allocate_activations(2, 6);
  fresh.forward(samples.batch(), 2, 6, GradientPass::Add);
  fresh.backward();
  const std::vector<float> once = gradients_of(fresh);
  EncoderClassifier model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(2, 6);
  std::fill_n(model.grads().as<float>(), model.num_parameters(), std::numeric_limits<float>::quiet_NaN());
  model.forward(samples.batch(), 2, 6, GradientPass::Write);
  model.backward();
  const std::vector<float> written = gradients_of(model);
  ASSERT_EQ(0, std::memcmp(written.data(), once.data(), once.size() * sizeof(float)));
  model.forward(samples.batch(), 2, 6, GradientPass::Add);
  model.backward();
  for (int64_t i = 0; i < model.num_parameters(); ++i) ASSERT_FLOAT_EQ(model.grads().as<float>()[i], 2 * once[i]) << i;
}

TEST(EncoderClassifier, ParameterCountMatchesTheClosedFormulaAndNamesReadAsBerts) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  EncoderClassifier model(config, *backend);
  const int64_t C = 24, L = 2, J = 2, Vp = 64, P = 8, types = 2, labels = 3;
  EXPECT_EQ(model.num_parameters(), (Vp + P + types) * C + L * (12 * C * C + 13 * C) + J * (C * C + C) + 2 * C +
                                        2 * (C * C + C) + C * labels + labels);
  EXPECT_EQ(model.layout().entries().front().name, "embeddings.word_embeddings.weight");
  EXPECT_EQ(model.layout().find("embeddings.token_type_embeddings.weight").shape, (Shape{types, C}));
  EXPECT_EQ(model.layout().find("encoder.layer.1.attention.qkv.weight").shape, (Shape{C, 3 * C}));
  EXPECT_EQ(model.layout().find("classifier.out_proj.weight").shape, (Shape{C, labels}));
  // The lab's model: 18 x 1280, 20 heads, FFN 5120, sequence 512, vocabulary 30000, 2 labels.
  EncoderConfig lab;
  lab.num_layers = 18;
  lab.hidden_size = 1280;
  lab.num_heads = 20;
  lab.max_position_embeddings = 512;
  lab.vocab_size = 30000;
  const int64_t count = encoder_parameter_layout(lab).total();
  EXPECT_GT(count, 380'000'000);
  EXPECT_LT(count, 400'000'000);
}

// A task a classifier must learn by attending past its first position: the label is whether the
// sequence holds token 5 (half of the samples do, at a random position). AdamW, as the Trainer
// steps it, for a hundred steps.
TEST(EncoderClassifier, LearnsWhetherATokenOccursAndPredictsIt) {
  auto backend = make_backend("cpu");
  EncoderConfig config = tiny_encoder();
  config.num_labels = 2;
  config.vocab_size = 12;
  EncoderClassifier model(config, *backend);
  model.init_weights(7);
  model.allocate_activations(16, 8);
  AdamW optimizer(*backend, model.layout(), model.params(), AdamwConfig{0.9f, 0.99f, 1e-8f, 0.0f});
  Rng rng(8);
  const auto make = [&](int64_t count) {
    Samples samples;
    for (int64_t b = 0; b < count; ++b) {
      const bool has = b % 2 == 0;
      const int64_t where = 1 + static_cast<int64_t>(rng.below(7));
      for (int64_t t = 0; t < 8; ++t) {
        auto id = static_cast<int32_t>(rng.below(11));
        if (id >= 5) ++id;  // never 5 by chance
        samples.ids.push_back(t == 0 ? 1 : has && t == where ? 5 : id);
        samples.mask.push_back(1);
      }
      samples.labels.push_back(has ? 1 : 0);
    }
    return samples;
  };
  const Samples test = make(16);
  const double before = model.forward(test.batch(), 16, 8);
  for (int step = 0; step < 100; ++step) {
    const Samples train = make(16);
    model.forward(train.batch(), 16, 8, GradientPass::Write);
    model.backward();
    optimizer.step(model.grads(), 3e-3f, 1.0f);
  }
  const double after = model.forward(test.batch(), 16, 8);
  EXPECT_LT(after, 0.3 * before) << before << " -> " << after;
  const std::vector<int32_t> predicted = model.predictions();
  int correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == test.labels[i];
  EXPECT_GE(correct, 15) << "of 16 (half of them hold the token)";
}

// A sample whose label is kUncountedTarget (the padding of a last validation batch) counts for
// nothing: loss, gradients and the predictions counted are those of the batch without it.
TEST(EncoderClassifier, AnUncountedLabelCountsForNothing) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  const int64_t B = 4, T = 6;
  EncoderClassifier model(config, *backend);
  model.init_weights(3);
  model.allocate_activations(B, T);
  Samples all = random_samples(B, T, config, 12), three;
  for (int64_t b = 0; b < B; ++b) {
    if (b == 2) continue;
    const auto first = static_cast<std::ptrdiff_t>(b * T);
    three.ids.insert(three.ids.end(), all.ids.begin() + first, all.ids.begin() + first + T);
    three.mask.insert(three.mask.end(), all.mask.begin() + first, all.mask.begin() + first + T);
    three.labels.push_back(all.labels[static_cast<size_t>(b)]);
  }
  const double expected = model.forward(three.batch(), B - 1, T, GradientPass::Write);
  EXPECT_EQ(model.counted(), B - 1);
  model.backward();
  const std::vector<float> expected_grads = gradients_of(model);
  all.labels[2] = kUncountedTarget;
  EXPECT_NEAR(model.forward(all.batch(), B, T, GradientPass::Write), expected, 1e-6 * expected);
  EXPECT_EQ(model.counted(), B - 1);
  model.backward();
  const std::vector<float> grads = gradients_of(model);
  for (size_t i = 0; i < grads.size(); ++i)
    ASSERT_NEAR(grads[i], expected_grads[i], 1e-6f + 1e-5f * std::abs(expected_grads[i])) << i;
  model.forward(all.batch(), B, T);
  ConfusionMatrix counts(config.num_labels);
  model.count_predictions(counts);
  EXPECT_EQ(counts.total(), 3.0);
  // None counted: no loss and no gradient.
  std::fill(all.labels.begin(), all.labels.end(), kUncountedTarget);
  EXPECT_EQ(model.forward(all.batch(), B, T, GradientPass::Write), 0.0);
  EXPECT_EQ(model.counted(), 0);
  model.backward();
  const std::vector<float> none = gradients_of(model);
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](float g) { return g == 0.0f; }));
}

// fp8 through intermediate layers: the last block's MLP casts its output gradient itself (block.h,
// BlockPass::output_gradient_cast false). Its gradients follow bf16's as closely as the first
// block's, whose gradient a LayerNorm cast; codes left from another product (the LayerNorm path
// taken by mistake) would be another gradient altogether. With dropout (both runs under one draw,
// so one set of masks) every projection casts its dropped output gradient itself (BranchDropout),
// the last one too where the final LayerNorm's backward writes its gradient (no intermediate
// layers): codes of the undropped gradient would be off by about half of it at rate 0.2.
void expect_fp8_gradients_follow_bf16s(float dropout, int64_t intermediate_layers) {
  auto backend = make_backend("cpu");
  EncoderConfig config = tiny_encoder(dropout);
  config.hidden_size = 32;  // fp8 products: multiples of 16
  config.num_intermediate_layers = intermediate_layers;
  const int64_t B = 4, T = 8;
  const Samples samples = random_samples(B, T, config, 21);
  const auto gradients = [&](bool fp8) {
    EncoderClassifier model(config, *backend, DType::BF16);
    model.init_weights(5);
    if (fp8) model.enable_fp8(Fp8Recipe{});
    model.allocate_activations(B, T);
    if (fp8) {  // scales from one pass, as the Trainer calibrates
      model.forward(samples.batch(), B, T, GradientPass::Write, 1.0f, kDraw);
      model.backward();
      model.fp8()->update_scales(0);
    }
    model.forward(samples.batch(), B, T, GradientPass::Write, 1.0f, kDraw);
    model.backward();
    return std::make_pair(gradients_of(model), model.layout());
  };
  const auto [bf16, layout] = gradients(false);
  const std::vector<float> fp8 = gradients(true).first;
  const auto relative_error = [&](const std::string& name) {
    const ParameterInfo& info = layout.find(name);
    double difference = 0.0, norm = 0.0;
    for (int64_t i = info.offset; i < info.offset + info.shape.numel(); ++i) {
      const auto k = static_cast<size_t>(i);
      difference += (fp8[k] - bf16[k]) * (fp8[k] - bf16[k]);
      norm += bf16[k] * bf16[k];
    }
    return std::sqrt(difference / norm);
  };
  for (const char* product : {"output.dense", "intermediate.dense", "attention.output.dense", "attention.qkv"}) {
    for (const char* part : {".weight", ".bias"}) {
      const double last = relative_error(std::string("encoder.layer.1.") + product + part);
      const double first = relative_error(std::string("encoder.layer.0.") + product + part);
      std::printf("dropout %g, %ld intermediate layers, %s%s: fp8 against bf16, relative error %.4f in the last "
                  "block, %.4f in the first\n",
                  dropout, static_cast<long>(intermediate_layers), product, part, last, first);
      // E5M2 gradients keep 2 mantissa bits: measured 0.01-0.13 in either block.
      EXPECT_LT(last, 0.2) << product << part;
      EXPECT_LT(first, 0.2) << product << part;
    }
  }
}

TEST(EncoderClassifier, Fp8GradientsFollowBf16sThroughTheIntermediateLayers) {
  expect_fp8_gradients_follow_bf16s(0.0f, 1);
}

TEST(EncoderClassifier, Fp8GradientsFollowBf16sWithDropout) {
  expect_fp8_gradients_follow_bf16s(0.2f, 1);
  expect_fp8_gradients_follow_bf16s(0.2f, 0);
}

TEST(EncoderClassifier, BadInputIsNamed) {
  auto backend = make_backend("cpu");
  const EncoderConfig config = tiny_encoder();
  EncoderClassifier model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(2, 4);
  Samples samples = random_samples(2, 4, config, 9);
  samples.labels[1] = 3;
  EXPECT_NE(error_of([&] { model.forward(samples.batch(), 2, 4); }).find("label 3 is outside [0, 3) (and not -100"),
            std::string::npos);
  samples.labels[1] = 0;
  samples.mask[4] = 0;
  EXPECT_NE(error_of([&] { model.forward(samples.batch(), 2, 4); }).find("sample 1 has no real first token"),
            std::string::npos);
  samples.mask[4] = 2;
  EXPECT_NE(error_of([&] { model.forward(samples.batch(), 2, 4); }).find("attention mask value 2 at position 4"),
            std::string::npos);
  samples.mask[4] = 1;
  samples.ids[2] = 37;
  EXPECT_NE(error_of([&] { model.forward(samples.batch(), 2, 4); }).find("token id 37 at position 2"),
            std::string::npos);
  EncoderConfig one_label = config;
  one_label.num_labels = 1;
  EXPECT_NE(error_of([&] { EncoderClassifier bad(one_label, *backend); }).find("num_labels must be at least 2"),
            std::string::npos);
}

// The CUDA back-end (the emulator in CI) against the CPU's: the same parameters give the same
// loss, logits and gradients, with dropout on (the same Philox masks).
TEST(CudaEncoderClassifier, FollowsTheCpuReference) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  const EncoderConfig config = tiny_encoder(0.1f);
  const Samples samples = random_samples(3, 8, config, 10);
  struct Result {
    double loss = 0;
    std::vector<float> logits, grads;
  };
  const auto run = [&](const std::string& device) {
    auto backend = make_backend(device);
    EncoderClassifier model(config, *backend);
    model.init_weights(12);
    model.allocate_activations(3, 8);
    Result result;
    model.forward(samples.batch(), 3, 8);
    result.logits = model.logits();
    result.loss = model.forward(samples.batch(), 3, 8, GradientPass::Write, 1.0f, kDraw);
    model.backward();
    result.grads.resize(static_cast<size_t>(model.num_parameters()));
    backend->copy_to_host(result.grads.data(), model.grads().data, result.grads.size() * sizeof(float));
    return result;
  };
  const Result cpu = run("cpu"), gpu = run("cuda");
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::abs(cpu.loss));
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
  for (size_t i = 0; i < cpu.logits.size(); ++i) EXPECT_NEAR(gpu.logits[i], cpu.logits[i], 1e-4) << i;
  double largest = 0, scale = 0;
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::abs(gpu.grads[i] - cpu.grads[i])));
    scale = std::max(scale, static_cast<double>(std::abs(cpu.grads[i])));
  }
  EXPECT_LT(largest, 1e-4 * scale) << largest << " of " << scale;
}

}  // namespace
}  // namespace kiln
