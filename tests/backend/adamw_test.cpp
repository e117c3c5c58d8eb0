// AdamW, sum of squares, dtype conversion and fill, and argument validation on every back-end,
// against double references and the host's conversions (core/dtype.h).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/backend/registry.h"
#include "kiln/core/error.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

class BackendTest : public OnEachBackend {};

TEST_P(BackendTest, AdamwMatchesDoubleReferenceOverSteps) {
  constexpr int64_t kCount = 1000;
  Rng rng(5);
  std::vector<float> master = random_floats(kCount, rng);
  DeviceTensors t(*backend_);
  Tensor params = t.floats(master, {kCount});
  Tensor m = t.floats(std::vector<float>(kCount, 0.0f), {kCount});
  Tensor v = t.floats(std::vector<float>(kCount, 0.0f), {kCount});
  const std::vector<AdamwSegment> segments = {{0, 300, 0.1f}, {300, 700, 0.0f}};
  std::vector<double> ref_p(master.begin(), master.end()), ref_m(kCount, 0), ref_v(kCount, 0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, grad_scale = 0.5f;
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grad = random_floats(kCount, rng);
    backend_->adamw_step({params, params, t.floats(grad, {kCount}), m, v, segments, lr, b1, b2, eps,
                          grad_scale, step});
    for (int64_t i = 0; i < kCount; ++i) {
      const double g = grad[i] * static_cast<double>(grad_scale);
      const double wd = i < 300 ? 0.1 : 0.0;
      ref_m[i] = b1 * ref_m[i] + (1 - b1) * g;
      ref_v[i] = b2 * ref_v[i] + (1 - b2) * g * g;
      const double m_hat = ref_m[i] / (1 - std::pow(b1, step));
      const double v_hat = ref_v[i] / (1 - std::pow(b2, step));
      ref_p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * ref_p[i]);
    }
  }
  EXPECT_LT(normalized_error(t.download(params), ref_p), 1e-6);
  EXPECT_LT(normalized_error(t.download(m), ref_m), 1e-6);
  EXPECT_LT(normalized_error(t.download(v), ref_v), 1e-6);
}

TEST_P(BackendTest, AdamwWritesLowPrecisionCopies) {
  constexpr int64_t kCount = 64;
  Rng rng(6);
  DeviceTensors t(*backend_);
  Tensor master = t.floats(random_floats(kCount, rng), {kCount});
  Tensor copy = t.upload(std::vector<uint16_t>(kCount, 0), {kCount}, DType::BF16);
  const std::vector<AdamwSegment> segments = {{0, kCount, 0.0f}};
  backend_->adamw_step({master, copy, t.floats(random_floats(kCount, rng), {kCount}),
                        t.floats(std::vector<float>(kCount, 0.0f), {kCount}),
                        t.floats(std::vector<float>(kCount, 0.0f), {kCount}), segments, 1e-3f});
  const std::vector<float> updated = t.download(master);
  std::vector<uint16_t> bits(kCount);
  backend_->copy_to_host(bits.data(), copy.data, bits.size() * sizeof(uint16_t));
  for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(bits[i], float_to_bf16(updated[i]));
}

TEST_P(BackendTest, SumOfSquaresIsExactAndPropagatesNan) {
  Rng rng(8);
  const std::vector<float> values = random_floats(200003, rng);
  DeviceTensors t(*backend_);
  double expected = 0;
  for (float value : values) expected += static_cast<double>(value) * value;
  EXPECT_NEAR(backend_->sum_of_squares({t.floats(values, {200003})}), expected, expected * 1e-12);
  std::vector<float> with_nan = values;
  with_nan[12345] = NAN;
  EXPECT_TRUE(std::isnan(backend_->sum_of_squares({t.floats(with_nan, {200003})})));
}

TEST_P(BackendTest, ShapeMismatchIsAnErrorNamingTheArgument) {
  DeviceTensors t(*backend_);
  Tensor out = t.poisoned({4, 5});
  try {
    backend_->matmul_forward({out, t.poisoned({4, 3}), t.poisoned({3, 6}), Tensor{}, WeightLayout::InOut});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'out'"), std::string::npos) << error.what();
  }
}

// Rounding cases: ties, subnormals of both 16-bit formats, fp16 overflow, infinities and NaN.
std::vector<float> conversion_cases() {
  Rng rng(21);
  std::vector<float> values = random_floats(300, rng, 10.0f);
  for (float value : {0.0f, -0.0f, 1.0f + 0x1.0p-8f, 1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 0x1.0p-20f,
                      -0x1.8p-126f, 0x1.0p-135f, 65504.0f, 65520.0f, 1e30f, -1e38f, INFINITY, -INFINITY, NAN})
    values.push_back(value);
  return values;
}

TEST_P(BackendTest, ConvertRoundsLikeTheHostBetweenEveryFloatDtype) {
  const std::vector<float> values = conversion_cases();
  const auto count = static_cast<int64_t>(values.size());
  for (DType from : {DType::F32, DType::BF16, DType::F16}) {
    for (DType to : {DType::F32, DType::BF16, DType::F16}) {
      DeviceTensors source(*backend_, from), target(*backend_, to);
      const Tensor in = source.acts(values, {count});
      const Tensor out = target.poisoned_acts({count});
      backend_->convert({out, in});
      const std::vector<float> expected = rounded_to(to, rounded_to(from, values));
      const std::vector<float> actual = target.download(out);
      for (size_t i = 0; i < values.size(); ++i) {
        if (std::isnan(expected[i])) {
          EXPECT_TRUE(std::isnan(actual[i])) << dtype_name(from) << " -> " << dtype_name(to) << " at " << i;
        } else {
          EXPECT_EQ(actual[i], expected[i]) << dtype_name(from) << " -> " << dtype_name(to) << " of " << values[i];
        }
      }
    }
  }
}

TEST_P(BackendTest, FillWritesEveryFloatDtype) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    DeviceTensors t(*backend_, dtype);
    const Tensor out = t.poisoned_acts({1000});
    backend_->fill({out, 0.1f});
    for (float value : t.download(out)) ASSERT_EQ(value, rounded_to(dtype, {0.1f})[0]) << dtype_name(dtype);
  }
}

TEST_P(BackendTest, MixedDtypesInOneOpAreAnErrorNamingTheArgument) {
  DeviceTensors bf16(*backend_, DType::BF16);
  DeviceTensors fp32(*backend_);
  const std::string message = error_of([&] {
    backend_->matmul_forward({bf16.poisoned_acts({4, 6}), bf16.poisoned_acts({4, 3}), fp32.poisoned({3, 6}), Tensor{},
                              WeightLayout::InOut});
  });
  EXPECT_NE(message.find("matmul_forward: argument 'weight' has dtype fp32, expected bf16"), std::string::npos)
      << message;
  // Parameter gradients stay fp32 under mixed precision.
  const std::string gradient = error_of([&] {
    backend_->matmul_backward({Tensor{}, bf16.poisoned_acts({3, 6}), Tensor{}, bf16.poisoned_acts({4, 6}),
                               bf16.poisoned_acts({4, 3}), bf16.poisoned_acts({3, 6}), WeightLayout::InOut});
  });
  EXPECT_NE(gradient.find("argument 'dweight' has dtype bf16, expected fp32"), std::string::npos) << gradient;
  // The fused GELU arguments are held to the compute dtype and shape like the others.
  const std::string gelu_out = error_of([&] {
    backend_->matmul_forward({bf16.poisoned_acts({4, 6}), bf16.poisoned_acts({4, 3}), bf16.poisoned_acts({3, 6}),
                              Tensor{}, WeightLayout::InOut, fp32.poisoned({4, 6})});
  });
  EXPECT_NE(gelu_out.find("argument 'gelu_out' has dtype fp32, expected bf16"), std::string::npos) << gelu_out;
  const std::string gelu_in = error_of([&] {
    backend_->matmul_backward({Tensor{}, fp32.poisoned({3, 6}), Tensor{}, bf16.poisoned_acts({4, 6}),
                               bf16.poisoned_acts({4, 3}), bf16.poisoned_acts({3, 6}), WeightLayout::InOut,
                               bf16.poisoned_acts({4, 3})});
  });
  EXPECT_NE(gelu_in.find("argument 'gelu_in' is given without 'din'"), std::string::npos) << gelu_in;
}

TEST_P(BackendTest, CrossEntropyRejectsTargetsOutsideVocabulary) {
  if (backend_->device() != Device::CPU)
    GTEST_SKIP() << "device back-ends leave value checks of device data to the caller (Gpt::forward)";
  DeviceTensors t(*backend_);
  EXPECT_THROW(backend_->softmax_cross_entropy({t.poisoned({2, 64}), t.poisoned({2}),
                                                t.ints({3, 11}, {2}), 11, -100, 1.0f, false}),
               Error);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendTest, ::testing::ValuesIn(all_backend_names()));

}  // namespace
}  // namespace kiln::testing
