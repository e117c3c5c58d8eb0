// MaskRows on every back-end (ops.h): kept rows are copied bit for bit, dropped rows are +0 over
// whatever they held (NaN included), in place as into another tensor, in every compute dtype, on
// CUDA's one-element path and in packs; bad arguments are refused by name. The values against the
// double reference and finite differences are the op table's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

class MaskRows : public OnEachBackend {};

TEST_P(MaskRows, KeepsRowsBitForBitAndZeroesTheOthersOverNaN) {
  const std::vector<int32_t> keep = {1, 0, 1, 1, 0};
  const auto M = static_cast<int64_t>(keep.size());
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t C : {7, 16}) {
      SCOPED_TRACE(fmt::format("{} C {}", dtype_name(dtype), C));
      Rng rng(5);
      std::vector<float> in = random_floats(static_cast<size_t>(M * C), rng, 3.0f);
      in[static_cast<size_t>(C + 2)] = std::numeric_limits<float>::quiet_NaN();  // in dropped row 1
      DeviceTensors t(*backend_, dtype);
      const Tensor stored = t.acts(in, {M, C}), mask = t.ints(keep, {M});
      const std::vector<float> as_stored = t.download(stored);
      Tensor out = t.poisoned_acts({M, C});
      backend_->mask_rows({out, stored, mask});
      const std::vector<float> masked = t.download(out);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < C; ++c) {
          const auto i = static_cast<size_t>(m * C + c);
          if (keep[static_cast<size_t>(m)] != 0) {
            ASSERT_EQ(std::memcmp(&masked[i], &as_stored[i], sizeof(float)), 0)
                << "row " << m << " c " << c;
          } else {
            ASSERT_EQ(masked[i], 0.0f) << "row " << m << " c " << c;
            ASSERT_FALSE(std::signbit(masked[i])) << "row " << m << " c " << c;
          }
        }
      backend_->mask_rows({stored, stored, mask});
      const std::vector<float> in_place = t.download(stored);
      EXPECT_EQ(std::memcmp(in_place.data(), masked.data(), masked.size() * sizeof(float)), 0)
          << "in place";
    }
}

TEST_P(MaskRows, BadArgumentsAreNamed) {
  DeviceTensors t(*backend_, DType::F32);
  const Tensor in = t.acts(std::vector<float>(12, 1.0f), {4, 3}), out = t.poisoned_acts({4, 3});
  EXPECT_NE(error_of([&] {
              backend_->mask_rows({out, in, t.ints({1, 1, 0, 1, 1}, {5})});
            }).find("mask_rows: argument 'in' [4, 3] does not split into the 5 rows of 'keep' [5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              backend_->mask_rows({out, in, t.floats({1, 1, 0, 1}, {4})});
            }).find("mask_rows: argument 'keep' has dtype fp32, expected int32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              backend_->mask_rows({t.poisoned_acts({4, 2}), in, t.ints({1, 1, 0, 1}, {4})});
            }).find("mask_rows: argument 'out' has 8 elements"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MaskRows, ::testing::ValuesIn(all_backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace kiln::testing
