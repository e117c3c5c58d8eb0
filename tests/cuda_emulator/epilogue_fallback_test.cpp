// The CUDA back-end's matrix products when cuBLASLt has no algorithm for an epilogue, or offers one
// and then refuses it when run (cuda_emulator::set_cublaslt_epilogues): the back-end must then add
// the bias, apply GELU and its derivative and sum the bias gradient in kernels of its own, match the
// CPU reference as closely as with the epilogues, and say in run_notes() that it fell back. On a GPU
// this path runs only where real cuBLASLt declines, which no test can arrange. The same for fp8
// products, whose input gradient never asks for the DGELU epilogue (cuda_matmul.cpp,
// dgelu_epilogue_applies): GELU's derivative is a kernel after the product, or, cast for the next
// product, in that cast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "cuda_emulator.h"
#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"

namespace kiln::testing {
namespace {

struct Results {
  std::vector<float> out, gelu_out, din, dweight, dbias;
};

// The MLP's two products as the GPT uses them: gelu(x W1 + b1) forward, and the backward of
// h W2 + b2 with h = gelu(pre), whose input gradient comes out as d pre; with `fp8`, both products
// on fp8 casts of their operands (scales 4, 16 and 8 for inputs, weight and output gradient). The
// backward adds its parameter gradients to 0.5 and 0.25, or writes them over NaN (`store`).
Results run_mlp_products(Backend& backend, DType dtype, bool fp8 = false, GradStore store = GradStore::Add) {
  // Multiples of 8: the GELU epilogues apply; of 16 with fp8, as its products ask.
  const int64_t M = 64, K = 48, N = fp8 ? 48 : 40;
  Rng rng(5);
  DeviceTensors t(backend, dtype);
  const Fp8Matmul casts = fixed_fp8_casts(t);
  const Fp8Matmul* products = fp8 ? &casts : nullptr;
  const Tensor in = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor weight = t.acts(random_floats(K * N, rng, 0.2f), {K, N});
  const Tensor bias = t.acts(random_floats(N, rng), {N});
  const Tensor out = t.poisoned_acts({M, N}), gelu_out = t.poisoned_acts({M, N});
  backend.matmul_forward({out, in, weight, bias, WeightLayout::InOut, gelu_out, products});

  const Tensor pre = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor hidden = t.poisoned_acts({M, K});
  backend.gelu_forward({hidden, pre});
  const Tensor dout = t.acts(random_floats(M * N, rng), {M, N});
  const Tensor din = t.poisoned_acts({M, K});
  const bool write = store == GradStore::Write;
  const Tensor dweight = t.floats(std::vector<float>(K * N, write ? NAN : 0.5f), {K, N});
  const Tensor dbias = t.floats(std::vector<float>(N, write ? NAN : 0.25f), {N});
  MatmulBackward backward{din, dweight, dbias, dout, hidden, weight, WeightLayout::InOut, pre, products};
  backward.param_store = store;
  backend.matmul_backward(backward);
  return {t.download(out), t.download(gelu_out), t.download(din), t.download(dweight), t.download(dbias)};
}

// The attention projection with the residual added inside it (ops.h): in W + b + residual, with
// `fp8` on casts of in and W (scales 4 and 16).
std::vector<float> run_projection(Backend& backend, DType dtype, bool fp8) {
  const int64_t M = 64, K = 48, N = 32;
  Rng rng(6);
  DeviceTensors t(backend, dtype);
  const Fp8Matmul casts = fixed_fp8_casts(t);
  MatmulForward product{t.poisoned_acts({M, N}), t.acts(random_floats(M * K, rng), {M, K}),
                        t.acts(random_floats(K * N, rng, 0.2f), {K, N}), t.acts(random_floats(N, rng), {N}),
                        WeightLayout::InOut, Tensor{}, fp8 ? &casts : nullptr};
  product.residual = t.acts(random_floats(M * N, rng, 4.0f), {M, N});
  backend.matmul_forward(product);
  return t.download(product.out);
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
  cuda_emulator::set_cublaslt_epilogues(refusal);
  auto gpu = make_backend("cuda");
  for (const GradStore store : {GradStore::Add, GradStore::Write}) {
    SCOPED_TRACE(store == GradStore::Add ? "gradients added" : "gradients written");
    const Results expected = run_mlp_products(*cpu, dtype, false, store);
    const Results actual = run_mlp_products(*gpu, dtype, false, store);
    EXPECT_LT(normalized_error(actual.out, expected.out), bound);
    EXPECT_LT(normalized_error(actual.gelu_out, expected.gelu_out), bound);
    EXPECT_LT(normalized_error(actual.din, expected.din), 2 * bound);
    EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 2 * bound);
    EXPECT_LT(normalized_error(actual.dbias, expected.dbias), 2 * bound);
  }
  const std::string notes = gpu->run_notes();
  // Four epilogue plans declined: bias + GELU, then bias alone (forward); the GELU derivative and the
  // bias gradient (backward; written into dbias and added through the workspace: one plan, as both
  // are 256-byte aligned here).
  EXPECT_NE(notes.find("0 shapes with an epilogue, 4 fell back to kernels"), std::string::npos) << notes;
}

// With the bias epilogue the residual is cuBLASLt's C read apart from D; without it the bias kernel
// adds the residual too, before the accumulating product. bf16 also on fp8 casts.
TEST_P(EmulatedEpilogueFallback, TheResidualIsAddedWhicheverWayTheBiasGoes) {
  const auto [dtype, refusal] = GetParam();
  const double bound = dtype == DType::BF16 ? 1e-2 : 2e-3;
  auto cpu = make_backend("cpu");
  for (const cuda_emulator::Epilogues epilogues : {cuda_emulator::Epilogues::Offered, refusal})
    for (const bool fp8 : {false, dtype == DType::BF16}) {
      SCOPED_TRACE(std::string(epilogues == cuda_emulator::Epilogues::Offered ? "offered" : "declined") +
                   (fp8 ? ", fp8" : ""));
      cuda_emulator::set_cublaslt_epilogues(epilogues);
      auto gpu = make_backend("cuda");
      EXPECT_LT(normalized_error(run_projection(*gpu, dtype, fp8), run_projection(*cpu, dtype, fp8)), bound);
    }
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

class EmulatedFp8Epilogues : public ::testing::TestWithParam<cuda_emulator::Epilogues> {
 protected:
  void TearDown() override { cuda_emulator::set_cublaslt_epilogues(cuda_emulator::Epilogues::Offered); }
};

// fp8 products: bias + GELU forward in an epilogue where cuBLASLt offers it, in kernels where it
// does not; the GELU derivative of the input gradient always in a kernel, never asked of cuBLASLt
// (slow on an H100: cuda_matmul.cpp); the bias gradient is always a kernel (it sums dout before
// its cast).
TEST_P(EmulatedFp8Epilogues, MatchTheCpuWithOrWithoutEpilogues) {
  auto cpu = make_backend("cpu");
  const Results expected = run_mlp_products(*cpu, DType::BF16, true);
  cuda_emulator::set_cublaslt_epilogues(GetParam());
  auto gpu = make_backend("cuda");
  const Results actual = run_mlp_products(*gpu, DType::BF16, true);
  EXPECT_LT(normalized_error(actual.out, expected.out), 1e-2);
  EXPECT_LT(normalized_error(actual.gelu_out, expected.gelu_out), 1e-2);
  EXPECT_LT(normalized_error(actual.din, expected.din), 2e-2);
  EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 2e-2);
  EXPECT_LT(normalized_error(actual.dbias, expected.dbias), 2e-2);
  const std::string notes = gpu->run_notes();
  const bool offered = GetParam() == cuda_emulator::Epilogues::Offered;
  // Offered: bias + GELU forward. Declined: bias + GELU, then bias alone (forward). The backward's
  // input gradient is a plain product either way.
  EXPECT_NE(notes.find(offered ? "1 shapes with an epilogue, 0 fell back" : "0 shapes with an epilogue, 2 fell back"),
            std::string::npos)
      << notes;
}

// The MLP's c_proj casting its input gradient for c_fc (ops.h, din_reader), the GELU derivative
// applied by the cast itself, whichever epilogues cuBLASLt offers: the codes are the cast of din as
// the product stores it without din_reader (through gelu_backward), the amax its largest
// magnitude, and c_fc's bias gradient its column sums.
TEST_P(EmulatedFp8Epilogues, AnInputGradientCastForItsReaderIsTheCastOfTheStoredOne) {
  cuda_emulator::set_cublaslt_epilogues(GetParam());
  auto gpu = make_backend("cuda");
  const int64_t M = 64, K = 48, N = 32;
  Rng rng(7);
  DeviceTensors t(*gpu, DType::BF16);
  const Fp8Matmul casts = fixed_fp8_casts(t), reader = fixed_fp8_casts(t);
  const Tensor hidden = t.acts(random_floats(M * K, rng), {M, K}), pre = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor weight = t.acts(random_floats(K * N, rng, 0.2f), {K, N});
  const Tensor dout = t.acts(random_floats(M * N, rng), {M, N});
  const Tensor dweight = t.floats(std::vector<float>(K * N, 0.0f), {K, N});
  const Tensor din = t.poisoned_acts({M, K});
  gpu->matmul_backward({din, dweight, Tensor{}, dout, hidden, weight, WeightLayout::InOut, pre, &casts});
  const std::vector<float> stored = t.download(din);

  const Tensor rows = poisoned_codes(t, {M, K}, DType::F8E5M2), columns = poisoned_codes(t, {K, M}, DType::F8E5M2);
  const Tensor reader_dbias = t.floats(std::vector<float>(K, 0.25f), {K});
  MatmulBackward cast{Tensor{}, dweight, Tensor{}, dout, hidden, weight, WeightLayout::InOut, pre, &casts};
  cast.din_reader = &reader;
  cast.din_fp8 = rows;
  cast.din_fp8_t = columns;
  cast.reader_dbias = reader_dbias;
  gpu->matmul_backward(cast);
  const std::vector<float> codes = t.download(rows), codes_t = t.download(columns);
  const std::vector<float> expected = decoded_cast(stored, 8.0f, DType::F8E5M2);
  float largest = 0.0f;
  std::vector<double> sums(K, 0.25);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float value = stored[m * K + k];
      ASSERT_EQ(codes[m * K + k], expected[m * K + k]) << m << ", " << k;
      ASSERT_EQ(codes_t[k * M + m], expected[m * K + k]) << m << ", " << k;
      largest = std::max(largest, std::fabs(value));
      sums[k] += value;
    }
  EXPECT_EQ(t.download(reader.dout.amax)[0], largest);
  const std::vector<float> dbias = t.download(reader_dbias);
  for (int64_t k = 0; k < K; ++k) EXPECT_NEAR(dbias[k], sums[k], 1e-5 * (1.0 + std::fabs(sums[k]))) << k;
}

INSTANTIATE_TEST_SUITE_P(Refusals, EmulatedFp8Epilogues,
                         ::testing::Values(cuda_emulator::Epilogues::Offered, cuda_emulator::Epilogues::NoAlgorithm,
                                           cuda_emulator::Epilogues::RefusedWhenRun),
                         [](const ::testing::TestParamInfo<cuda_emulator::Epilogues>& info) {
                           return std::string(info.param == cuda_emulator::Epilogues::Offered       ? "offered"
                                              : info.param == cuda_emulator::Epilogues::NoAlgorithm ? "no_algorithm"
                                                                                                     : "refused_when_run");
                         });

}  // namespace
}  // namespace kiln::testing
