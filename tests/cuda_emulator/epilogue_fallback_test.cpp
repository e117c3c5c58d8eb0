// The CUDA back-end's matrix products when cuBLASLt has no algorithm for an epilogue, or offers one
// and then refuses it when run (cuda_emulator::set_cublaslt_epilogues): the back-end must then add
// the bias, apply GELU and its derivative and sum the bias gradient in kernels of its own, match the
// CPU reference as closely as with the epilogues, and say in run_notes() that it fell back. On a GPU
// this path runs only where real cuBLASLt declines, which no test can arrange.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "cuda_emulator.h"
#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

struct Results {
  std::vector<float> out, gelu_out, din, dweight, dbias;
};

// The MLP's two products as the GPT uses them: gelu(x W1 + b1) forward, and the backward of
// h W2 + b2 with h = gelu(pre), whose input gradient comes out as d pre.
Results run_mlp_products(Backend& backend, DType dtype) {
  constexpr int64_t M = 64, K = 48, N = 40;  // multiples of 8: the GELU epilogues apply
  Rng rng(5);
  DeviceTensors t(backend, dtype);
  const Tensor in = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor weight = t.acts(random_floats(K * N, rng, 0.2f), {K, N});
  const Tensor bias = t.acts(random_floats(N, rng), {N});
  const Tensor out = t.poisoned_acts({M, N}), gelu_out = t.poisoned_acts({M, N});
  backend.matmul_forward({out, in, weight, bias, WeightLayout::InOut, gelu_out});

  const Tensor pre = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor hidden = t.poisoned_acts({M, K});
  backend.gelu_forward({hidden, pre});
  const Tensor dout = t.acts(random_floats(M * N, rng), {M, N});
  const Tensor din = t.poisoned_acts({M, K});
  const Tensor dweight = t.floats(std::vector<float>(K * N, 0.5f), {K, N});
  const Tensor dbias = t.floats(std::vector<float>(N, 0.25f), {N});
  backend.matmul_backward({din, dweight, dbias, dout, hidden, weight, WeightLayout::InOut, pre});
  return {t.download(out), t.download(gelu_out), t.download(din), t.download(dweight), t.download(dbias)};
}

using Case = std::tuple<DType, cuda_emulator::Epilogues>;

class EmulatedEpilogueFallback : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { cuda_emulator::set_cublaslt_epilogues(cuda_emulator::Epilogues::Offered); }
};

TEST_P(EmulatedEpilogueFallback, KernelsDoTheEpiloguesWorkAndSaySo) {
  const auto [dtype, refusal] = GetParam();
  const double bound = dtype == DType::BF16 ? 1e-2 : 2e-3;  // the op table's (ops_test.cpp)
  auto cpu = make_backend("cpu");
  const Results expected = run_mlp_products(*cpu, dtype);

  cuda_emulator::set_cublaslt_epilogues(refusal);
  auto gpu = make_backend("cuda");
  const Results actual = run_mlp_products(*gpu, dtype);
  EXPECT_LT(normalized_error(actual.out, expected.out), bound);
  EXPECT_LT(normalized_error(actual.gelu_out, expected.gelu_out), bound);
  EXPECT_LT(normalized_error(actual.din, expected.din), 2 * bound);
  EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 2 * bound);
  EXPECT_LT(normalized_error(actual.dbias, expected.dbias), 2 * bound);
  const std::string notes = gpu->run_notes();
  // Four epilogue plans declined: bias + GELU, then bias alone (forward); the GELU derivative and the
  // bias gradient (backward).
  EXPECT_NE(notes.find("0 shapes with an epilogue, 4 fell back to kernels"), std::string::npos) << notes;
}

INSTANTIATE_TEST_SUITE_P(
    Refusals, EmulatedEpilogueFallback,
    ::testing::Combine(::testing::Values(DType::BF16, DType::F16),
                       ::testing::Values(cuda_emulator::Epilogues::NoAlgorithm,
                                         cuda_emulator::Epilogues::RefusedWhenRun)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(dtype_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) == cuda_emulator::Epilogues::NoAlgorithm ? "_no_algorithm"
                                                                               : "_refused_when_run");
    });

}  // namespace
}  // namespace kiln::testing
