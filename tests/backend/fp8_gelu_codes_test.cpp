// The MLP's first product casting its GELU output for the next fp8 product (ops.h, MatmulForward
// with gelu_fp8) on every back-end: the codes it writes, in either layout, and the product that
// reads them are bit for bit the GELU op's output cast by that product itself (with its input's
// codes kept for the backward); the pre-activation and the amax are those bits too, whether the
// first product is fp8 or not, and the GELU op that casts gives the same codes from the kept
// pre-activation. On a GPU the cast is the CPU's up to GELU's last bit before rounding. Shapes
// cross the CUDA cast kernel's edges: 48 rows (a block of 32 and half of one) and a GELU output
// 272 wide (two tiles of 128 and part of a third). Arguments that do not fit are refused by name.
#include <gtest/gtest.h>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 48, C = 32, H = 272, N = 16;  // in [M, C] -> GELU output [M, H] -> out [M, N]

// Both products' inputs, the same on every run.
struct Mlp {
  Tensor in, fc_weight, fc_bias, proj_weight, proj_bias;
};
Mlp random_mlp(DeviceTensors& t) {
  Rng rng(11);
  return {t.acts(random_floats(M * C, rng), {M, C}), t.acts(random_floats(C * H, rng, 0.3f), {C, H}),
          t.acts(random_floats(H, rng, 0.5f), {H}), t.acts(random_floats(H * N, rng, 0.1f), {H, N}),
          t.acts(random_floats(N, rng), {N})};
}

// What one way of running the two products leaves.
struct Outcome {
  std::vector<float> pre_gelu, codes, codes_t, out, gelu_amax, fc_amaxes;
};

// The first product's fp8 arguments (scales that keep its operands' codes in range), or none.
struct FcFp8 {
  explicit FcFp8(DeviceTensors& t)
      : fp8{fp8_operand(t, 16.0f, 0.0f), fp8_operand(t, 64.0f, 0.0f), Fp8Operand{}} {}
  Fp8Matmul fp8;
};

// `cast_by_fc`: c_fc casts its GELU output (gelu_fp8) into `codes` (unless `rows_too` is false)
// and the transpose; else c_fc keeps the pre-activation, the GELU op runs, and the second product
// casts its output, keeping the transpose.
Outcome run(Backend& backend, bool cast_by_fc, bool fc_is_fp8, bool rows_too = true) {
  DeviceTensors t(backend, DType::BF16);
  const Mlp mlp = random_mlp(t);
  FcFp8 fc(t);
  Fp8Matmul proj{fp8_operand(t, 4.0f, 0.125f), fp8_operand(t, 256.0f, 0.0f), Fp8Operand{}};
  const Tensor pre = t.poisoned_acts({M, H}), codes = poisoned_codes(t, {M, H}), codes_t = poisoned_codes(t, {H, M});
  const Tensor out = t.poisoned_acts({M, N});
  MatmulForward expansion{pre, mlp.in, mlp.fc_weight, mlp.fc_bias, WeightLayout::InOut, Tensor{},
                          fc_is_fp8 ? &fc.fp8 : nullptr};
  if (cast_by_fc) {
    expansion.gelu_out = rows_too ? codes : Tensor{};
    expansion.gelu_fp8 = &proj.in;
    expansion.gelu_out_t = codes_t;
    backend.matmul_forward(expansion);
    if (rows_too)
      backend.matmul_forward({out, codes, mlp.proj_weight, mlp.proj_bias, WeightLayout::InOut, Tensor{}, &proj});
  } else {
    backend.matmul_forward(expansion);
    const Tensor gelu = t.poisoned_acts({M, H});
    backend.gelu_forward({gelu, pre});
    backend.matmul_forward(
        {out, gelu, mlp.proj_weight, mlp.proj_bias, WeightLayout::InOut, Tensor{}, &proj, codes_t});
  }
  std::vector<float> fc_amaxes = t.download(fc.fp8.in.amax);
  fc_amaxes.push_back(t.download(fc.fp8.weight.amax)[0]);
  return {t.download(pre), cast_by_fc && rows_too ? t.download(codes) : std::vector<float>{}, t.download(codes_t),
          cast_by_fc && !rows_too ? std::vector<float>{} : t.download(out), t.download(proj.in.amax), fc_amaxes};
}

class Fp8GeluCodes : public OnEachBackend {};

TEST_P(Fp8GeluCodes, CodesAreTheNextProductsOwnCastOfTheGeluOutput) {
  for (const bool fc_is_fp8 : {false, true}) {
    SCOPED_TRACE(fc_is_fp8 ? "c_fc in fp8" : "c_fc in bf16");
    const Outcome plain = run(*backend_, false, fc_is_fp8);
    const Outcome cast = run(*backend_, true, fc_is_fp8);
    EXPECT_EQ(cast.out, plain.out);
    EXPECT_EQ(cast.codes_t, plain.codes_t);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(cast.codes[m * H + h], cast.codes_t[h * M + m]) << "codes (" << m << ", " << h << ") and their transpose";
    EXPECT_EQ(cast.pre_gelu, plain.pre_gelu);
    EXPECT_EQ(cast.gelu_amax, plain.gelu_amax);
    EXPECT_GT(cast.gelu_amax[0], 0.125f);  // the GELU output's max |y| was folded in
    EXPECT_EQ(cast.fc_amaxes, plain.fc_amaxes);
    // Only the transpose (a replayed block's c_fc, block.h): the same codes.
    const Outcome transposed_only = run(*backend_, true, fc_is_fp8, /*rows_too=*/false);
    EXPECT_EQ(transposed_only.codes_t, plain.codes_t);
    EXPECT_EQ(transposed_only.gelu_amax, plain.gelu_amax);
  }
}

// The GELU op that casts (ops.h, GeluForward with fp8; selective recomputation's way back to the
// codes): from c_fc's kept pre-activation, the codes c_fc's own cast wrote, bit for bit.
TEST_P(Fp8GeluCodes, TheGeluOpCastsAsTheProductDoes) {
  const Outcome by_fc = run(*backend_, true, false);
  DeviceTensors t(*backend_, DType::BF16);
  const Tensor pre = t.acts(by_fc.pre_gelu, {M / 16, 16, H});  // any leading shape of M rows
  const Fp8Operand cast_by_op = fp8_operand(t, 4.0f, 0.125f);
  const Tensor codes = poisoned_codes(t, {M, H}), codes_t = poisoned_codes(t, {H, M});
  backend_->gelu_forward({codes, pre, &cast_by_op, codes_t});
  EXPECT_EQ(t.download(codes), by_fc.codes);
  EXPECT_EQ(t.download(codes_t), by_fc.codes_t);
  EXPECT_EQ(t.download(cast_by_op.amax), by_fc.gelu_amax);
  const Tensor transposed_only = poisoned_codes(t, {H, M});
  backend_->gelu_forward({Tensor{}, pre, &cast_by_op, transposed_only});
  EXPECT_EQ(t.download(transposed_only), by_fc.codes_t);
  const std::string nowhere = error_of([&] { backend_->gelu_forward({Tensor{}, pre, &cast_by_op}); });
  EXPECT_NE(nowhere.find("gelu_forward: 'fp8' is given without 'out' or 'out_fp8_t'"), std::string::npos) << nowhere;
  const std::string without_fp8 =
      error_of([&] { backend_->gelu_forward({t.poisoned_acts({M, H}), pre, nullptr, codes_t}); });
  EXPECT_NE(without_fp8.find("gelu_forward: argument 'out_fp8_t' is given without 'fp8'"), std::string::npos)
      << without_fp8;
}

TEST_P(Fp8GeluCodes, TheCastIsTheCpusUpToGelusLastBit) {
  if (GetParam() == "cpu") GTEST_SKIP() << "compares another back-end with the CPU";
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  const Outcome expected = run(*cpu, true, true), actual = run(*backend_, true, true);
  EXPECT_LT(normalized_error(actual.pre_gelu, expected.pre_gelu), 1e-2);
  // E4M3 keeps 3 mantissa bits: a GELU value that rounds differently moves one code at most.
  EXPECT_LT(normalized_error(actual.codes, expected.codes), 2e-2);
  EXPECT_LT(normalized_error(actual.out, expected.out), 2e-2);
  EXPECT_NEAR(actual.gelu_amax[0], expected.gelu_amax[0], 1e-2 * expected.gelu_amax[0]);
}

TEST_P(Fp8GeluCodes, ArgumentsThatDoNotFitAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Operand scale = fp8_operand(t, 1.0f, 0.0f);
  const auto expansion = [&](DeviceTensors& in_dtype, int64_t rows) {
    MatmulForward product{in_dtype.poisoned_acts({rows, H}), in_dtype.acts(std::vector<float>(rows * C, 1.0f), {rows, C}),
                          in_dtype.acts(std::vector<float>(C * H, 1.0f), {C, H}), Tensor{}, WeightLayout::InOut,
                          poisoned_codes(t, {rows, H})};
    product.gelu_fp8 = &scale;
    product.gelu_out_t = poisoned_codes(t, {H, rows});
    return product;
  };
  const auto expect_refusal = [&](const MatmulForward& product, const std::string& message) {
    const std::string error = error_of([&] { backend_->matmul_forward(product); });
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  expect_refusal(expansion(t, 40), "matmul_forward: a GELU output cast to fp8 needs M and N multiples of 16, got 40 x 272");
  DeviceTensors fp32(*backend_, DType::F32);
  expect_refusal(expansion(fp32, M), "matmul_forward: a GELU output cast to fp8 needs bf16 or fp16, not fp32");
  MatmulForward nowhere = expansion(t, M);
  nowhere.gelu_out = nowhere.gelu_out_t = Tensor{};
  expect_refusal(nowhere, "'gelu_fp8' is given without 'gelu_out' or 'gelu_out_t' (the codes go nowhere)");
  MatmulForward sixteen_bit = expansion(t, M);
  sixteen_bit.gelu_out = t.poisoned_acts({M, H});
  expect_refusal(sixteen_bit, "argument 'gelu_out' has dtype bf16, expected fp8_e4m3");
  MatmulForward untransposed = expansion(t, M);
  untransposed.gelu_out_t = poisoned_codes(t, {M, H});
  expect_refusal(untransposed, "argument 'gelu_out_t' must be [N, M] = [272, 48], got [48, 272]");
  MatmulForward with_residual = expansion(t, M);
  with_residual.residual = t.acts(std::vector<float>(M * H, 1.0f), {M, H});
  expect_refusal(with_residual, "argument 'residual' is given with GELU");
  MatmulForward without_cast = expansion(t, M);
  without_cast.gelu_fp8 = nullptr;
  without_cast.gelu_out = t.poisoned_acts({M, H});
  expect_refusal(without_cast, "argument 'gelu_out_t' is given without 'gelu_fp8'");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8GeluCodes, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
