// The op table: every case on every back-end. Forward against the double-precision reference;
// backward against central finite differences of that reference.
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

class OpTableTest : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(std::get<0>(GetParam()));
    if (!reason.empty()) GTEST_SKIP() << reason;
    backend_ = make_backend(std::get<0>(GetParam()));
    op_ = all_op_cases()[std::get<1>(GetParam())];
  }
  std::unique_ptr<Backend> backend_;
  OpCase op_;
};

TEST_P(OpTableTest, ForwardMatchesDoubleReference) {
  const std::vector<float> actual = op_.forward(*backend_, op_.inputs);
  const std::vector<double> expected = op_.reference(to_double(op_.inputs));
  EXPECT_LT(normalized_error(actual, expected), op_.forward_tolerance) << op_.name;
}

TEST_P(OpTableTest, BackwardMatchesFiniteDifferences) {
  if (!op_.backward) GTEST_SKIP() << op_.name << " has no backward";
  const size_t outputs = op_.reference(to_double(op_.inputs)).size();
  Rng rng(99);
  std::vector<float> dout = random_floats(outputs, rng);
  if (op_.uniform_dout) std::fill(dout.begin(), dout.end(), 0.37f);
  const FloatInputs grads = op_.backward(*backend_, op_.inputs, dout);
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
    EXPECT_LT(normalized_error(grads[g], numeric), op_.backward_tolerance)
        << op_.name << " gradient of input " << op_.differentiable[g];
  }
}

std::string case_name(const ::testing::TestParamInfo<OpTableTest::ParamType>& info) {
  return std::get<0>(info.param) + "_" + all_op_cases()[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTableTest,
                         ::testing::Combine(::testing::ValuesIn(all_backend_names()),
                                            ::testing::Range(size_t{0}, all_op_cases().size())),
                         case_name);

}  // namespace
}  // namespace kiln::testing
