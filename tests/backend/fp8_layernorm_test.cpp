// A LayerNorm that casts its output for an fp8 product (ops.h, LayerNormForward with fp8) on every
// back-end: the codes it writes, in both layouts, and the product that reads them are bit for bit
// the plain LayerNorm's output cast by the product itself (with the input's codes kept for the
// backward), with the transpose or without it; its statistics and the amax are those bits too.
// Shapes cross the CUDA kernel's edges: 48 rows (a block of 32 and half of one) and 272 columns
// (two tiles of 128 and part of a third). Arguments that do not fit are refused by name.
#include <gtest/gtest.h>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 48, C = 272, N = 32;

class Fp8LayerNorm : public OnEachBackend {};

TEST_P(Fp8LayerNorm, CodesAreTheProductsOwnCastOfTheOutput) {
  DeviceTensors t(*backend_, DType::BF16);
  Rng rng(5);
  const Tensor in = t.acts(random_floats(M * C, rng, 2.0f), {M, C});
  const Tensor weight = t.acts(random_floats(C, rng), {C}), bias = t.acts(random_floats(C, rng), {C});
  const Tensor product_weight = t.acts(random_floats(C * N, rng, 0.1f), {C, N});
  const Tensor product_bias = t.acts(random_floats(N, rng), {N});
  struct Run {
    Tensor mean, rstd, codes_t, out;
    Fp8Matmul fp8;
  };
  const auto fresh = [&] {
    return Run{t.poisoned({M}), t.poisoned({M}), poisoned_codes(t, {C, M}),
               t.poisoned_acts({M, N}),
               Fp8Matmul{fp8_operand(t, 8.0f, 0.25f), fp8_operand(t, 64.0f, 0.0f), Fp8Operand{}}};
  };
  // Plain: the LayerNorm's output, cast by the product, which keeps the codes transposed.
  Run plain = fresh();
  const Tensor normalised = t.poisoned_acts({M, C});
  backend_->layernorm_forward({normalised, plain.mean, plain.rstd, in, weight, bias, 1e-5f});
  backend_->matmul_forward({plain.out, normalised, product_weight, product_bias, WeightLayout::InOut, Tensor{},
                            &plain.fp8, plain.codes_t});
  // Cast by the LayerNorm: only codes, which the product reads.
  Run cast = fresh();
  const Tensor codes = poisoned_codes(t, {M, C});
  backend_->layernorm_forward(
      {Tensor{}, cast.mean, cast.rstd, in, weight, bias, 1e-5f, &cast.fp8.in, codes, cast.codes_t});
  backend_->matmul_forward({cast.out, codes, product_weight, product_bias, WeightLayout::InOut, Tensor{}, &cast.fp8});

  EXPECT_EQ(t.download(cast.out), t.download(plain.out));
  EXPECT_EQ(t.download(cast.codes_t), t.download(plain.codes_t));
  const std::vector<float> rows = t.download(codes), columns = t.download(cast.codes_t);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(rows[m * C + c], columns[c * M + m]) << "codes (" << m << ", " << c << ") and their transpose";
  EXPECT_EQ(t.download(cast.fp8.in.amax), t.download(plain.fp8.in.amax));
  EXPECT_GT(t.download(cast.fp8.in.amax)[0], 0.25f);  // the output's max |y| was folded in
  EXPECT_EQ(t.download(cast.fp8.weight.amax), t.download(plain.fp8.weight.amax));
  EXPECT_EQ(t.download(cast.mean), t.download(plain.mean));
  EXPECT_EQ(t.download(cast.rstd), t.download(plain.rstd));
  // Without the transpose (no backward will read it): the same codes, statistics and amax.
  Run rows_only = fresh();
  const Tensor rows_only_codes = poisoned_codes(t, {M, C});
  backend_->layernorm_forward(
      {Tensor{}, rows_only.mean, rows_only.rstd, in, weight, bias, 1e-5f, &rows_only.fp8.in, rows_only_codes});
  EXPECT_EQ(t.download(rows_only_codes), rows);
  EXPECT_EQ(t.download(rows_only.fp8.in.amax), t.download(plain.fp8.in.amax));
  EXPECT_EQ(t.download(rows_only.mean), t.download(plain.mean));
}

TEST_P(Fp8LayerNorm, ArgumentsThatDoNotFitAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Operand scale = fp8_operand(t, 1.0f, 0.0f);
  const auto norm = [&](int64_t rows, DeviceTensors& in_dtype) {
    return LayerNormForward{Tensor{}, t.poisoned({rows}), t.poisoned({rows}),
                            in_dtype.acts(std::vector<float>(rows * C, 1.0f), {rows, C}),
                            in_dtype.acts(std::vector<float>(C, 1.0f), {C}),
                            in_dtype.acts(std::vector<float>(C, 0.0f), {C}), 1e-5f, &scale,
                            poisoned_codes(t, {rows, C}), poisoned_codes(t, {C, rows})};
  };
  const std::string rows = error_of([&] { backend_->layernorm_forward(norm(40, t)); });
  EXPECT_NE(rows.find("layernorm_forward: an output cast to fp8 needs rows and columns multiples of 16, got 40 x 272"),
            std::string::npos)
      << rows;
  DeviceTensors fp32(*backend_, DType::F32);
  const std::string dtype = error_of([&] { backend_->layernorm_forward(norm(M, fp32)); });
  EXPECT_NE(dtype.find("an output cast to fp8 needs bf16 or fp16, not fp32"), std::string::npos) << dtype;
  LayerNormForward with_out = norm(M, t);
  with_out.out = t.poisoned_acts({M, C});
  const std::string out = error_of([&] { backend_->layernorm_forward(with_out); });
  EXPECT_NE(out.find("argument 'out' is given with 'fp8'"), std::string::npos) << out;
  LayerNormForward untransposed = norm(M, t);
  untransposed.out_fp8_t = poisoned_codes(t, {M, C});
  const std::string shape = error_of([&] { backend_->layernorm_forward(untransposed); });
  EXPECT_NE(shape.find("argument 'out_fp8_t' must be [C, M] = [272, 48], got [48, 272]"), std::string::npos) << shape;
  const std::string no_fp8 = error_of([&] {
    backend_->matmul_forward({t.poisoned_acts({M, N}), poisoned_codes(t, {M, C}),
                              t.acts(std::vector<float>(C * N, 1.0f), {C, N}), Tensor{}, WeightLayout::InOut});
  });
  EXPECT_NE(no_fp8.find("matmul_forward: argument 'in' is fp8 codes for a product without fp8"), std::string::npos)
      << no_fp8;
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8LayerNorm, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
