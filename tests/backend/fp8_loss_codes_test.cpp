// The loss casting the logits' gradient for the classifier's fp8 backward, on every back-end (ops.h,
// SoftmaxCrossEntropy with fp8; MatmulBackward with dout cast already): the losses are the plain
// op's, the logits are left as they were, the codes in both layouts are the cast of the gradient
// the plain op stores (ignored rows and padding columns zero), the amax folds that gradient's
// max |x|, and the classifier's backward reading the codes gives bit for bit what it gives casting
// the stored gradient itself. Shapes cross the CUDA kernels' edges: 48 rows (a 32-row transpose
// tile and half of another) and 144 padded columns (a 128-column tile and part of another), and a
// vocabulary without padding. Arguments that do not fit are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"
#include "support/fp8_codes.h"

namespace kiln::testing {
namespace {

constexpr int64_t kHidden = 32;  // the classifier's input width
constexpr int32_t kIgnore = -100;
constexpr float kGradScale = 4096.0f, kAmaxBefore = 1e-4f;

struct LossShape {
  int64_t M, V, Vp;
};
const LossShape kShapes[] = {{48, 130, 144}, {32, 64, 64}};

// Logits of a plausible spread, targets with every third row of the first shape ignored, and the
// classifier's operands: the same on every run of one shape.
struct Inputs {
  std::vector<float> logits;
  std::vector<int32_t> targets;
  Tensor hidden, wte;
};
Inputs random_inputs(DeviceTensors& t, LossShape s) {
  Rng rng(11);
  Inputs in{rounded_to(DType::BF16, random_floats(s.M * s.Vp, rng, 3.0f)), {}, {}, {}};
  for (int64_t m = 0; m < s.M; ++m)
    in.targets.push_back(s.V != s.Vp && m % 3 == 2 ? kIgnore : static_cast<int32_t>((m * 37) % s.V));
  in.hidden = t.acts(random_floats(s.M * kHidden, rng), {s.M, kHidden});
  in.wte = t.acts(random_floats(s.Vp * kHidden, rng, 0.2f), {s.Vp, kHidden});
  return in;
}

struct Outcome {
  std::vector<float> losses, logits_after;
  std::vector<float> gradient;        // the stored gradient (the plain run only)
  std::vector<float> codes, codes_t;  // decoded codes (the cast run only)
  std::vector<float> din, dweight;    // the classifier's gradients
  float amax = 0.0f;
};

// `cast`: the loss casts the gradient and the classifier's backward reads the codes; else the loss
// stores the gradient in place and the backward casts it.
Outcome run(Backend& backend, LossShape s, DType format, bool cast) {
  DeviceTensors t(backend, DType::BF16);
  const Inputs in = random_inputs(t, s);
  const Fp8Matmul classifier{fp8_operand(t, 8.0f, 0.0f), fp8_operand(t, 16.0f, 0.0f),
                             fp8_operand(t, kGradScale, kAmaxBefore), format};
  const Tensor logits = t.acts(in.logits, {s.M, s.Vp}), losses = t.poisoned({s.M});
  SoftmaxCrossEntropy loss{logits, losses, t.ints(in.targets, {s.M}), s.V, kIgnore, 1.0f / static_cast<float>(s.M),
                           /*write_grad=*/true};
  const Tensor din = t.poisoned_acts({s.M, kHidden});
  const Tensor dweight = t.floats(std::vector<float>(static_cast<size_t>(s.Vp * kHidden), 0.0f), {s.Vp, kHidden});
  MatmulBackward backward{din, dweight, Tensor{}, logits, in.hidden, in.wte, WeightLayout::OutIn, Tensor{}, &classifier};
  if (cast) {
    loss.fp8 = &classifier;
    loss.grad_fp8 = poisoned_codes(t, {s.M, s.Vp}, format);
    loss.grad_fp8_t = poisoned_codes(t, {s.Vp, s.M}, format);
    backward.dout = loss.grad_fp8;
    backward.dout_fp8_t = loss.grad_fp8_t;
  }
  backend.softmax_cross_entropy(loss);
  backend.matmul_backward(backward);
  Outcome outcome;
  outcome.losses = t.download(losses);
  outcome.logits_after = t.download(logits);
  if (cast) {
    outcome.codes = t.download(loss.grad_fp8);
    outcome.codes_t = t.download(loss.grad_fp8_t);
  } else {
    outcome.gradient = outcome.logits_after;
  }
  outcome.din = t.download(din);
  outcome.dweight = t.download(dweight);
  outcome.amax = t.download(classifier.dout.amax)[0];
  return outcome;
}

std::string shape_name(LossShape s, DType format) {
  return std::to_string(s.M) + " x " + std::to_string(s.Vp) + " (vocabulary " + std::to_string(s.V) + "), " +
         std::string(dtype_name(format));
}

class Fp8LossGradient : public OnEachBackend {};

TEST_P(Fp8LossGradient, CodesAreTheClassifiersOwnCastOfTheGradient) {
  for (const LossShape s : kShapes) {
    for (const DType format : {DType::F8E5M2, DType::F8E4M3}) {
      SCOPED_TRACE(shape_name(s, format));
      DeviceTensors host_side(*backend_, DType::BF16);
      const Inputs in = random_inputs(host_side, s);
      const Outcome plain = run(*backend_, s, format, false), cast = run(*backend_, s, format, true);
      EXPECT_EQ(cast.losses, plain.losses);
      EXPECT_EQ(cast.logits_after, in.logits) << "the logits are only read";
      EXPECT_EQ(cast.codes, decoded_cast(plain.gradient, kGradScale, format));
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t v = 0; v < s.Vp; ++v) {
          ASSERT_EQ(cast.codes_t[v * s.M + m], cast.codes[m * s.Vp + v]) << "codes (" << m << ", " << v << ") transposed";
          if (in.targets[m] == kIgnore || v >= s.V) {
            ASSERT_EQ(cast.codes[m * s.Vp + v], 0.0f) << m << ", " << v;
          }
        }
      float largest = kAmaxBefore;
      for (const float x : plain.gradient) largest = std::max(largest, std::fabs(x));
      EXPECT_EQ(cast.amax, largest);
      EXPECT_EQ(cast.amax, plain.amax);
      EXPECT_EQ(cast.din, plain.din);
      EXPECT_EQ(cast.dweight, plain.dweight);
    }
  }
}

TEST_P(Fp8LossGradient, CudaCastsAsTheCpuDoes) {
  if (GetParam() == "cpu") GTEST_SKIP() << "compares another back-end with the CPU";
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (const LossShape s : kShapes) {
    SCOPED_TRACE(shape_name(s, DType::F8E5M2));
    const Outcome expected = run(*cpu, s, DType::F8E5M2, true), actual = run(*backend_, s, DType::F8E5M2, true);
    // The GPU's exponentials round differently: a gradient element may move one code.
    EXPECT_LT(normalized_error(actual.codes, expected.codes), 5e-2);
    EXPECT_LT(normalized_error(actual.losses, expected.losses), 1e-4);
    EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 5e-2);
    EXPECT_NEAR(actual.amax, expected.amax, 1e-2 * expected.amax);
  }
}

TEST_P(Fp8LossGradient, ArgumentsThatDoNotFitAreRefused) {
  const LossShape s = kShapes[0];
  DeviceTensors t(*backend_, DType::BF16);
  const Inputs in = random_inputs(t, s);
  const Fp8Matmul classifier = fixed_fp8_casts(t);
  const auto error = [&](auto mutate) {
    SoftmaxCrossEntropy loss{t.acts(in.logits, {s.M, s.Vp}), t.poisoned({s.M}), t.ints(in.targets, {s.M}), s.V,
                             kIgnore, 1.0f, true, &classifier, poisoned_codes(t, {s.M, s.Vp}, DType::F8E5M2),
                             poisoned_codes(t, {s.Vp, s.M}, DType::F8E5M2)};
    mutate(loss);
    return error_of([&] { backend_->softmax_cross_entropy(loss); });
  };
  EXPECT_EQ(error([](SoftmaxCrossEntropy&) {}), "");
  EXPECT_NE(error([](SoftmaxCrossEntropy& a) { a.write_grad = false; }).find("'fp8' is given without write_grad"),
            std::string::npos);
  EXPECT_NE(error([](SoftmaxCrossEntropy& a) { a.fp8 = nullptr; }).find("codes of the gradient are given without 'fp8'"),
            std::string::npos);
  EXPECT_NE(error([&](SoftmaxCrossEntropy& a) {
              a.grad_fp8_t = poisoned_codes(t, {s.M, s.Vp}, DType::F8E5M2);
            }).find("grad_fp8_t"),
            std::string::npos);
  EXPECT_NE(error([&](SoftmaxCrossEntropy& a) {
              a.grad_fp8 = poisoned_codes(t, {s.M, s.Vp}, DType::F8E4M3);  // the gradient's format is E5M2
            }).find("grad_fp8"),
            std::string::npos);
  DeviceTensors fp32(*backend_, DType::F32);
  const Tensor fp32_logits = fp32.acts(in.logits, {s.M, s.Vp});
  EXPECT_NE(error([&](SoftmaxCrossEntropy& a) { a.logits = fp32_logits; }).find("needs bf16 or fp16"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8LossGradient, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
