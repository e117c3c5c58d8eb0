// Dropout's mask on every back-end (ops.h): it is the bits ops.h defines, element by element (so
// CUDA's is the CPU's), the share kept is 1 - p, the mask is a function of
// (seed, stream, element) alone, so the same call draws it again (a recomputed forward, the
// backward) while another stream or seed draws another; p = 0 keeps everything; the op works in
// place; bad arguments are refused by name. The values against the reference are the op table's.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/backend/registry.h"
#include "kiln/core/philox.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t kCount = 1 << 15;

class Dropout : public OnEachBackend {
 protected:
  // The op on all-ones of kCount elements in `dtype`.
  std::vector<float> mask(float probability, uint64_t seed, uint64_t stream, DType dtype = DType::F32) {
    DeviceTensors t(*backend_, dtype);
    Tensor out = t.poisoned_acts({kCount});
    backend_->dropout({out, t.acts(std::vector<float>(kCount, 1.0f), {kCount}), probability, seed, stream});
    return t.download(out);
  }
};

// In every compute dtype (the packs of 16-bit elements included), the elements kept are exactly
// those whose bits reach the threshold, at a low rate, a half and a high one.
TEST_P(Dropout, KeepsExactlyTheElementsItsBitsSayInEveryDtype) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const float p : {0.1f, 0.5f, 0.9f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " p " + std::to_string(p));
      const std::vector<float> values = mask(p, 5, 6, dtype);
      for (size_t i = 0; i < values.size(); ++i)
        ASSERT_EQ(values[i] != 0.0f, philox::bits(5, 6, i) >= dropout_threshold(p)) << "element " << i;
    }
}

TEST_P(Dropout, KeepsOneMinusPScaledAndDrawsOneMaskPerSeedAndStream) {
  const float p = 0.1f;
  const std::vector<float> first = mask(p, 1, 2);
  int64_t kept = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_TRUE(first[i] == 0.0f || first[i] == 1.0f / (1.0f - p)) << first[i];
    // The very bits every back-end draws.
    ASSERT_EQ(first[i] != 0.0f, philox::bits(1, 2, i) >= dropout_threshold(p)) << "element " << i;
    kept += first[i] != 0.0f;
  }
  const double sigma = std::sqrt(kCount * p * (1.0 - p));  // binomial
  EXPECT_LT(std::abs(static_cast<double>(kept) - kCount * (1.0 - p)), 5 * sigma) << kept;
  EXPECT_EQ(mask(p, 1, 2), first) << "the same seed and stream draw the same mask";
  for (const auto& [seed, stream] : {std::pair<uint64_t, uint64_t>{1, 3}, {2, 2}}) {
    const std::vector<float> other = mask(p, seed, stream);
    int64_t differ = 0;
    for (size_t i = 0; i < other.size(); ++i) differ += (other[i] == 0.0f) != (first[i] == 0.0f);
    // Two independent masks differ where exactly one drops: 2 p (1 - p) of the elements.
    EXPECT_NEAR(static_cast<double>(differ) / kCount, 2 * p * (1 - p), 0.02) << seed << " " << stream;
  }
}

TEST_P(Dropout, ProbabilityZeroKeepsEverythingAndInPlaceWorks) {
  DeviceTensors t(*backend_);
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) - 500.0f;
  Tensor x = t.floats(values, {1000});
  backend_->dropout({x, x, 0.0f, 9, 9});
  EXPECT_EQ(t.download(x), values);
  Tensor y = t.floats(values, {1000});
  Tensor expected = t.poisoned({1000});
  backend_->dropout({expected, y, 0.5f, 9, 9});
  backend_->dropout({y, y, 0.5f, 9, 9});  // out aliases in
  EXPECT_EQ(t.download(y), t.download(expected));
}

// The fused dropout-add: residual + the plain op's output (exactly, in fp32; in 16 bits the fused
// op rounds once, the op table checks it), also in place over the residual.
TEST_P(Dropout, WithAResidualAddsItToTheDroppedInput) {
  {
    DeviceTensors t(*backend_);
    std::vector<float> in(kCount), residual(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      in[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3.0f;
      residual[static_cast<size_t>(i)] = static_cast<float>(i % 5);
    }
    Tensor dropped = t.poisoned_acts({kCount});
    backend_->dropout({dropped, t.acts(in, {kCount}), 0.25f, 3, 4});
    Tensor summed = t.poisoned_acts({kCount});
    backend_->dropout({summed, t.acts(in, {kCount}), 0.25f, 3, 4, t.acts(residual, {kCount})});
    const std::vector<float> plain = t.download(dropped), fused = t.download(summed);
    for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(fused[i], residual[i] + plain[i]) << "element " << i;
    Tensor stream = t.acts(residual, {kCount});  // out aliases the residual
    backend_->dropout({stream, t.acts(in, {kCount}), 0.25f, 3, 4, stream});
    EXPECT_EQ(t.download(stream), fused);
  }
}

TEST_P(Dropout, BadArgumentsAreRefusedByName) {
  DeviceTensors t(*backend_);
  Tensor in = t.floats(std::vector<float>(8, 1.0f), {8});
  Tensor short_out = t.poisoned({7});
  EXPECT_NE(error_of([&] { backend_->dropout({short_out, in, 0.5f, 0, 0}); }).find("dropout"), std::string::npos);
  DeviceTensors half(*backend_, DType::BF16);
  Tensor other_dtype = half.poisoned_acts({8});
  EXPECT_NE(error_of([&] { backend_->dropout({other_dtype, in, 0.5f, 0, 0}); }).find("dropout"), std::string::npos);
  Tensor short_residual = t.floats(std::vector<float>(7, 1.0f), {7});
  Tensor out = t.poisoned({8});
  EXPECT_NE(error_of([&] { backend_->dropout({out, in, 0.5f, 0, 0, short_residual}); }).find("residual"),
            std::string::npos);
  for (float p : {1.0f, -0.1f, NAN}) {
    Tensor out = t.poisoned({8});
    EXPECT_NE(error_of([&] { backend_->dropout({out, in, p, 0, 0}); }).find("dropout: probability must be in [0, 1)"),
              std::string::npos)
        << p;
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Dropout, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
