// Which fp8 products of the CUDA back-end ask cuBLASLt for fast accumulation
// (BackendOptions::fp8_fast_accumulation): the forward's, unless switched off; never the backward's
// two (input and weight gradients), nor a bf16 product. The emulator's cuBLASLt counts the calls
// that ask (cuda_emulator::cublaslt_fast_accumulation_runs); it cannot show the precision they
// trade, which a GPU's cuBLASLt does not document.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda_emulator.h"
#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"

namespace kiln::testing {
namespace {

struct Runs {
  int64_t forward = 0, backward = 0;  // products issued with fast accumulation
};

// One linear layer's forward and backward, bf16, on fp8 casts of its operands or not.
Runs fast_accumulation_runs(bool option, bool fp8) {
  auto backend = make_backend("cuda", BackendOptions{.fp8_fast_accumulation = option});
  const int64_t M = 32, K = 48, N = 64;  // multiples of 16, as fp8 products ask
  Rng rng(3);
  DeviceTensors t(*backend, DType::BF16);
  const Fp8Matmul casts = fixed_fp8_casts(t);
  const Fp8Matmul* products = fp8 ? &casts : nullptr;
  const Tensor in = t.acts(random_floats(M * K, rng), {M, K});
  const Tensor weight = t.acts(random_floats(K * N, rng, 0.2f), {K, N});
  const Tensor bias = t.acts(random_floats(N, rng), {N});
  Runs runs;
  const int64_t before = cuda_emulator::cublaslt_fast_accumulation_runs();
  backend->matmul_forward({t.poisoned_acts({M, N}), in, weight, bias, WeightLayout::InOut, Tensor{}, products});
  runs.forward = cuda_emulator::cublaslt_fast_accumulation_runs() - before;
  const Tensor dweight = t.floats(std::vector<float>(K * N, 0.0f), {K, N});
  const Tensor dbias = t.floats(std::vector<float>(N, 0.0f), {N});
  backend->matmul_backward({t.poisoned_acts({M, K}), dweight, dbias, t.acts(random_floats(M * N, rng), {M, N}), in,
                            weight, WeightLayout::InOut, Tensor{}, products});
  runs.backward = cuda_emulator::cublaslt_fast_accumulation_runs() - before - runs.forward;
  return runs;
}

TEST(EmulatedFp8FastAccumulation, OnlyTheForwardProductTakesItByDefault) {
  const Runs runs = fast_accumulation_runs(BackendOptions{}.fp8_fast_accumulation, true);
  EXPECT_EQ(runs.forward, 1);
  EXPECT_EQ(runs.backward, 0);
}

TEST(EmulatedFp8FastAccumulation, SwitchedOffNoProductTakesIt) {
  const Runs runs = fast_accumulation_runs(false, true);
  EXPECT_EQ(runs.forward, 0);
  EXPECT_EQ(runs.backward, 0);
}

TEST(EmulatedFp8FastAccumulation, Bf16ProductsNeverTakeIt) {
  const Runs runs = fast_accumulation_runs(true, false);
  EXPECT_EQ(runs.forward, 0);
  EXPECT_EQ(runs.backward, 0);
}

}  // namespace
}  // namespace kiln::testing
