// The op table: every case on every back-end. Forward against the double-precision reference;
// backward against central finite differences of that reference. Every case also runs in bf16 and
// fp16: inputs and the output gradient are rounded to the dtype first (the reference sees the same
// values), and the bound is the dtype's, not fp32's.
#include <gtest/gtest.h>

#include "backend/op_case.h"
#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

DoubleInputs to_double(const FloatInputs& inputs) {
  DoubleInputs result;
  for (const auto& input : inputs) result.emplace_back(input.begin(), input.end());
  return result;
}

// Normalised-error bounds for bf16 (8 significant bits) and fp16 (11): a few units of the dtype's
// rounding error 2^-9 and 2^-12, since outputs and, in chains, intermediates are rounded.
struct Tolerance {
  double forward, backward;
};
Tolerance tolerance_for(DType dtype, const OpCase& op) {
  switch (dtype) {
    case DType::BF16: return {1e-2, 2e-2};
    case DType::F16: return {2e-3, 4e-3};
    default: return {op.forward_tolerance, op.backward_tolerance};
  }
}

DType dtype_named(const std::string& name) {
  return name == "bf16" ? DType::BF16 : name == "fp16" ? DType::F16 : DType::F32;
}

// The table, built once per process: its random inputs are generated at test registration, and
// gtest names every (back-end, dtype, case) from it.
const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = all_op_cases();
  return cases;
}

class OpTableTest : public ::testing::TestWithParam<std::tuple<std::string, std::string, size_t>> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(std::get<0>(GetParam()));
    if (!reason.empty()) GTEST_SKIP() << reason;
    backend_ = make_backend(std::get<0>(GetParam()));
    dtype_ = dtype_named(std::get<1>(GetParam()));
    op_ = op_cases()[std::get<2>(GetParam())];
    for (std::vector<float>& input : op_.inputs) input = rounded_to(dtype_, input);
    tolerance_ = tolerance_for(dtype_, op_);
  }
  std::unique_ptr<Backend> backend_;
  DType dtype_ = DType::F32;
  OpCase op_;
  Tolerance tolerance_{};
};

TEST_P(OpTableTest, ForwardMatchesDoubleReference) {
  const std::vector<float> actual = op_.forward(*backend_, dtype_, op_.inputs);
  const std::vector<double> expected = op_.reference(to_double(op_.inputs));
  EXPECT_LT(normalized_error(actual, expected), tolerance_.forward) << op_.name;
}

TEST_P(OpTableTest, BackwardMatchesFiniteDifferences) {
  if (!op_.backward) GTEST_SKIP() << op_.name << " has no backward";
  const size_t outputs = op_.reference(to_double(op_.inputs)).size();
  Rng rng(99);
  std::vector<float> dout = random_floats(outputs, rng);
  if (op_.uniform_dout) std::fill(dout.begin(), dout.end(), 0.37f);
  dout = rounded_to(dtype_, dout);
  const FloatInputs grads = op_.backward(*backend_, dtype_, op_.inputs, dout);
  ASSERT_EQ(grads.size(), op_.differentiable.size());

  DoubleInputs point = to_double(op_.inputs);
  const auto objective = [&] {
    const std::vector<double> out = op_.reference(point);
    double sum = 0.0;
    for (size_t i = 0; i < out.size(); ++i) sum += out[i] * dout[i];
    return sum;
  };
  constexpr double kStep = 1e-5;
  for (size_t g = 0; g < grads.size(); ++g) {
    std::vector<double>& input = point[op_.differentiable[g]];
    std::vector<double> numeric(input.size());
    for (size_t i = 0; i < input.size(); ++i) {
      const double saved = input[i];
      input[i] = saved + kStep;
      const double plus = objective();
      input[i] = saved - kStep;
      const double minus = objective();
      input[i] = saved;
      numeric[i] = (plus - minus) / (2 * kStep);
    }
    EXPECT_LT(normalized_error(grads[g], numeric), tolerance_.backward)
        << op_.name << " gradient of input " << op_.differentiable[g];
  }
}

std::string case_name(const ::testing::TestParamInfo<OpTableTest::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + op_cases()[std::get<2>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTableTest,
                         ::testing::Combine(::testing::ValuesIn(all_backend_names()),
                                            ::testing::Values("fp32", "bf16", "fp16"),
                                            ::testing::Range(size_t{0}, op_cases().size())),
                         case_name);

}  // namespace
}  // namespace kiln::testing
