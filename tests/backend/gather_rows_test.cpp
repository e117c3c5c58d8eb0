// GatherRows on every back-end (ops.h): the forward copies exactly the position's row of each
// sequence; the backward's Write sets that row and zeroes every other row of din (over NaN), its
// Add adds to that row and leaves every other row untouched, bit for bit; rows of an odd width
// (CUDA's one-element path) and of packs alike, in every compute dtype; bad arguments are refused
// by name. The values against the double reference and finite differences are the op table's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t kB = 3, kT = 4;

// Small integers and halves: exact in bf16 and fp16, and so are their sums below.
std::vector<float> exact_values(int64_t count, float offset) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = offset + 0.5f * static_cast<float>(i % 61);
  return values;
}

class GatherRows : public OnEachBackend {};

TEST_P(GatherRows, ForwardCopiesThePositionsRowOfEachSequence) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t C : {5, 16})
      for (const int64_t position : {int64_t{0}, kT - 1}) {
        SCOPED_TRACE(fmt::format("{} C {} position {}", dtype_name(dtype), C, position));
        DeviceTensors t(*backend_, dtype);
        const std::vector<float> in = exact_values(kB * kT * C, -7.0f);
        Tensor out = t.poisoned_acts({kB, C});
        backend_->gather_rows({out, t.acts(in, {kB, kT, C}), position});
        const std::vector<float> rows = t.download(out);
        for (int64_t b = 0; b < kB; ++b)
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(rows[static_cast<size_t>(b * C + c)], in[static_cast<size_t>((b * kT + position) * C + c)])
                << "b " << b << " c " << c;
      }
}

TEST_P(GatherRows, WriteSetsThePositionsRowsAndZeroesEveryOtherRow) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t C : {5, 16}) {
      SCOPED_TRACE(fmt::format("{} C {}", dtype_name(dtype), C));
      const int64_t position = 2;
      DeviceTensors t(*backend_, dtype);
      const std::vector<float> dout = exact_values(kB * C, 1.0f);
      Tensor din = t.poisoned_acts({kB, kT, C});  // Write never reads it: the NaN goes
      backend_->gather_rows_backward({din, t.acts(dout, {kB, C}), position, GradStore::Write});
      const std::vector<float> grad = t.download(din);
      for (int64_t b = 0; b < kB; ++b)
        for (int64_t p = 0; p < kT; ++p)
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(grad[static_cast<size_t>((b * kT + p) * C + c)],
                      p == position ? dout[static_cast<size_t>(b * C + c)] : 0.0f)
                << "b " << b << " t " << p << " c " << c;
    }
}

TEST_P(GatherRows, AddAddsToThePositionsRowsAndLeavesEveryOtherRowUntouched) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t C : {5, 16}) {
      SCOPED_TRACE(fmt::format("{} C {}", dtype_name(dtype), C));
      const int64_t position = 1;
      DeviceTensors t(*backend_, dtype);
      const std::vector<float> dout = exact_values(kB * C, 1.0f), seed = exact_values(kB * kT * C, -20.0f);
      Tensor din = t.acts(seed, {kB, kT, C});
      backend_->gather_rows_backward({din, t.acts(dout, {kB, C}), position, GradStore::Add});
      const std::vector<float> grad = t.download(din);
      for (int64_t b = 0; b < kB; ++b)
        for (int64_t p = 0; p < kT; ++p)
          for (int64_t c = 0; c < C; ++c) {
            const auto at = static_cast<size_t>((b * kT + p) * C + c);
            ASSERT_EQ(grad[at], p == position ? seed[at] + dout[static_cast<size_t>(b * C + c)] : seed[at])
                << "b " << b << " t " << p << " c " << c;
          }
    }
}

TEST_P(GatherRows, BadArgumentsAreRefusedByName) {
  DeviceTensors t(*backend_);
  const int64_t C = 8;
  Tensor in = t.floats(exact_values(kB * kT * C, 0.0f), {kB, kT, C});
  Tensor out = t.poisoned({kB, C});
  for (const int64_t position : {kT, int64_t{-1}})
    EXPECT_NE(error_of([&] { backend_->gather_rows({out, in, position}); }).find("gather_rows: position"),
              std::string::npos)
        << position;
  Tensor wrong_rows = t.poisoned({kB + 1, C}), flat = t.poisoned({kB * kT * C});
  EXPECT_NE(error_of([&] { backend_->gather_rows({wrong_rows, in, 0}); }).find("'out' must be [B, C]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { backend_->gather_rows({out, flat, 0}); }).find("'in' must be [B, T, C]"),
            std::string::npos);
  DeviceTensors half(*backend_, DType::BF16);
  Tensor half_out = half.poisoned_acts({kB, C});
  EXPECT_NE(error_of([&] { backend_->gather_rows({half_out, in, 0}); }).find("gather_rows: argument 'out' has dtype"),
            std::string::npos);

  Tensor din = t.poisoned({kB, kT, C}), dout = t.poisoned({kB, C});
  EXPECT_NE(error_of([&] { backend_->gather_rows_backward({din, dout, kT}); }).find("gather_rows_backward: position"),
            std::string::npos);
  EXPECT_NE(error_of([&] { backend_->gather_rows_backward({din, wrong_rows, 0}); }).find("'dout' must be [B, C]"),
            std::string::npos);
  Tensor half_dout = half.poisoned_acts({kB, C});
  EXPECT_NE(error_of([&] { backend_->gather_rows_backward({din, half_dout, 0}); })
                .find("gather_rows_backward: argument 'dout' has dtype"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GatherRows, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
