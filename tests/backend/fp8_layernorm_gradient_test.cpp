// A LayerNorm backward that casts its input gradient for the fp8 product reading it next (ops.h,
// LayerNormBackward with fp8; MatmulBackward with dout cast already) on every back-end: din is
// stored bit for bit as without the cast (added to what it held, or written), its codes in both
// layouts are the cast of that stored din the product's backward would make, its amax folds max
// |din|, the product's bias gradient is din's column sums (added or written), and the product's
// backward reading the codes gives bit for bit what it gives casting din itself. Shapes cross the
// CUDA kernel's edges: 48 rows (a tile of 32 and half of one), 80 columns (less than a tile of
// 128), 272 (two tiles and part of a third), 768 (GPT-2 124M's width: rows held in registers, three
// packs of 8 a lane) and 2064 (wider than registers hold, and than the plain kernel's 2048-column
// slice). Arguments that do not fit are refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t kK = 32;  // the product: out [M, C] = in [M, kK] @ weight [kK, C]

struct Size {
  int64_t M, C;
};
const Size kSizes[] = {{48, 272}, {64, 80}, {32, 768}, {48, 2064}};

// The LayerNorm's and the product's inputs, the same on every run of one size.
struct Inputs {
  Tensor in, weight, mean, rstd, dout, din_before, product_in, product_weight;
};
Inputs random_inputs(DeviceTensors& t, Backend& backend, Size s) {
  Rng rng(7);
  Inputs in{t.acts(random_floats(s.M * s.C, rng, 2.0f), {s.M, s.C}), t.acts(random_floats(s.C, rng), {s.C}),
            t.poisoned({s.M}), t.poisoned({s.M}), t.acts(random_floats(s.M * s.C, rng), {s.M, s.C}),
            t.acts(random_floats(s.M * s.C, rng, 0.5f), {s.M, s.C}), t.acts(random_floats(s.M * kK, rng), {s.M, kK}),
            t.acts(random_floats(kK * s.C, rng, 0.2f), {kK, s.C})};
  backend.layernorm_forward({t.poisoned_acts({s.M, s.C}), in.mean, in.rstd, in.in, in.weight,
                             t.acts(random_floats(s.C, rng), {s.C}), 1e-5f});
  return in;
}

// What the LayerNorm backward and the product's backward leave.
struct Outcome {
  std::vector<float> din, dweight, dbias;                        // the LayerNorm's
  std::vector<float> codes, codes_t;                             // decoded (the cast run only)
  std::vector<float> product_din, product_dweight, product_dbias;  // the product's
  float amax = 0.0f;
};

constexpr float kDoutScale = 4.0f, kAmaxBefore = 1e-3f, kBiasBefore = 0.5f;

// `cast`: the LayerNorm casts din and takes the product's bias gradient, and the product's backward
// reads the codes; else the product's backward casts din itself. `din_store`: din added to the
// inputs' din_before, or written; `store`: the parameter gradients', over kBiasBefore.
Outcome run(Backend& backend, Size s, DType format, bool cast, GradStore din_store = GradStore::Add,
            GradStore store = GradStore::Add) {
  DeviceTensors t(backend, DType::BF16);
  const Inputs in = random_inputs(t, backend, s);
  Fp8Matmul product{fp8_operand(t, 16.0f, 0.0f), fp8_operand(t, 32.0f, 0.0f),
                    fp8_operand(t, kDoutScale, kAmaxBefore), format};
  const auto parameter_gradient = [&](int64_t count) {
    return t.floats(std::vector<float>(static_cast<size_t>(count), kBiasBefore), {count});
  };
  const Tensor din = din_store == GradStore::Add ? t.acts(t.download(in.din_before), {s.M, s.C})
                                                 : t.poisoned_acts({s.M, s.C});
  const Tensor dweight = parameter_gradient(s.C), dbias = parameter_gradient(s.C);
  const Tensor product_din = t.poisoned_acts({s.M, kK}), product_dweight = parameter_gradient(kK * s.C);
  const Tensor product_dbias = parameter_gradient(s.C);
  LayerNormBackward norm{din, dweight, dbias, in.dout, in.in, in.weight, in.mean, in.rstd, store, din_store};
  MatmulBackward projection{product_din, product_dweight.reshaped({kK, s.C}), product_dbias, din, in.product_in,
                            in.product_weight, WeightLayout::InOut, Tensor{}, &product};
  projection.param_store = store;
  if (cast) {
    norm.fp8 = &product;
    norm.din_fp8 = poisoned_codes(t, {s.M, s.C}, format);
    norm.din_fp8_t = poisoned_codes(t, {s.C, s.M}, format);
    norm.product_dbias = product_dbias;
    projection.dout = norm.din_fp8;
    projection.dout_fp8_t = norm.din_fp8_t;
    projection.dbias = Tensor{};
  }
  backend.layernorm_backward(norm);
  backend.matmul_backward(projection);
  Outcome outcome{t.download(din), t.download(dweight), t.download(dbias), {}, {}, t.download(product_din),
                  t.download(product_dweight), t.download(product_dbias), t.download(product.dout.amax)[0]};
  if (cast) {
    outcome.codes = t.download(norm.din_fp8);
    outcome.codes_t = t.download(norm.din_fp8_t);
  }
  return outcome;
}

void expect_near_each(const std::vector<float>& actual, const std::vector<float>& expected, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], 1e-5 * (1.0 + std::fabs(expected[i]))) << what << " " << i;
}

class Fp8LayerNormGradient : public OnEachBackend {};

TEST_P(Fp8LayerNormGradient, CodesAreTheProductsOwnCastOfTheStoredGradient) {
  for (const Size s : kSizes)
    for (const DType format : {DType::F8E5M2, DType::F8E4M3})
      for (const GradStore din_store : {GradStore::Add, GradStore::Write}) {
        SCOPED_TRACE(std::to_string(s.M) + " x " + std::to_string(s.C) + ", " + std::string(dtype_name(format)) +
                     (din_store == GradStore::Add ? ", din added" : ", din written"));
        const Outcome plain = run(*backend_, s, format, false, din_store);
        const Outcome cast = run(*backend_, s, format, true, din_store);
        EXPECT_EQ(cast.din, plain.din);  // stored as without the cast
        EXPECT_EQ(cast.codes, decoded_cast(plain.din, kDoutScale, format));
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t c = 0; c < s.C; ++c)
            ASSERT_EQ(cast.codes_t[c * s.M + m], cast.codes[m * s.C + c])
                << "codes (" << m << ", " << c << ") transposed";
        // The product's backward: the same bits from the codes as from its own cast, its bias
        // gradient included (the same column sums, in the same order, on every back-end).
        EXPECT_EQ(cast.product_din, plain.product_din);
        EXPECT_EQ(cast.product_dweight, plain.product_dweight);
        EXPECT_EQ(cast.product_dbias, plain.product_dbias);
        EXPECT_EQ(cast.amax, plain.amax);
        float largest = kAmaxBefore;
        for (const float x : plain.din) largest = std::max(largest, std::fabs(x));
        EXPECT_EQ(cast.amax, largest);
        // The LayerNorm's own gradients: on a GPU summed in tiles of 32 rows instead of runs.
        expect_near_each(cast.dweight, plain.dweight, "dweight");
        expect_near_each(cast.dbias, plain.dbias, "dbias");
        if (GetParam() == "cpu") {
          EXPECT_EQ(cast.dweight, plain.dweight);
          EXPECT_EQ(cast.dbias, plain.dbias);
        }
      }
}

TEST_P(Fp8LayerNormGradient, TheProductsBiasGradientIsWrittenWhenAsked) {
  const Size s = kSizes[0];
  const Outcome added = run(*backend_, s, DType::F8E5M2, true, GradStore::Add, GradStore::Add);
  const Outcome written = run(*backend_, s, DType::F8E5M2, true, GradStore::Add, GradStore::Write);
  for (size_t n = 0; n < added.product_dbias.size(); ++n) {
    EXPECT_FLOAT_EQ(written.product_dbias[n] + kBiasBefore, added.product_dbias[n]) << "column " << n;
    EXPECT_FLOAT_EQ(written.dbias[n] + kBiasBefore, added.dbias[n]) << "column " << n;
  }
  EXPECT_EQ(written.codes, added.codes);
}

TEST_P(Fp8LayerNormGradient, CudaCastsAsTheCpuDoes) {
  if (GetParam() == "cpu") GTEST_SKIP() << "compares another back-end with the CPU";
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (const Size s : kSizes) {
    SCOPED_TRACE(std::to_string(s.M) + " x " + std::to_string(s.C));
    const Outcome expected = run(*cpu, s, DType::F8E5M2, true), actual = run(*backend_, s, DType::F8E5M2, true);
    EXPECT_LT(normalized_error(actual.din, expected.din), 1e-2);
    // E5M2 keeps 2 mantissa bits: a gradient element that rounds differently moves one code.
    EXPECT_LT(normalized_error(actual.codes, expected.codes), 5e-2);
    EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 1e-2);
    EXPECT_LT(normalized_error(actual.dbias, expected.dbias), 1e-2);
    EXPECT_LT(normalized_error(actual.product_dbias, expected.product_dbias), 1e-2);
    EXPECT_LT(normalized_error(actual.product_dweight, expected.product_dweight), 5e-2);
    EXPECT_NEAR(actual.amax, expected.amax, 1e-2 * expected.amax);
  }
}

TEST_P(Fp8LayerNormGradient, ArgumentsThatDoNotFitAreRefused) {
  const Size s = kSizes[0];
  const auto refusal = [&](DType dtype, int64_t M, const auto& change) {
    DeviceTensors t(*backend_, dtype);
    Rng rng(3);
    Fp8Matmul product{fp8_operand(t, 1.0f, 0.0f), fp8_operand(t, 1.0f, 0.0f), fp8_operand(t, 1.0f, 0.0f),
                      DType::F8E5M2};
    LayerNormBackward a{t.poisoned_acts({M, s.C}), t.poisoned({s.C}), t.poisoned({s.C}),
                        t.acts(random_floats(M * s.C, rng), {M, s.C}), t.acts(random_floats(M * s.C, rng), {M, s.C}),
                        t.acts(random_floats(s.C, rng), {s.C}), t.floats(std::vector<float>(M, 0.0f), {M}),
                        t.floats(std::vector<float>(M, 1.0f), {M})};
    a.fp8 = &product;
    a.din_fp8 = poisoned_codes(t, {M, s.C}, DType::F8E5M2);
    a.din_fp8_t = poisoned_codes(t, {s.C, M}, DType::F8E5M2);
    a.product_dbias = t.poisoned({s.C});
    change(t, a);
    return error_of([&] { backend_->layernorm_backward(a); });
  };
  const auto expect_refusal = [&](const std::string& error, const std::string& message) {
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  const auto none = [](DeviceTensors&, LayerNormBackward&) {};
  EXPECT_EQ(refusal(DType::BF16, s.M, none), "");  // the arguments below differ from these in one way each
  expect_refusal(refusal(DType::BF16, s.M,
                         [&](DeviceTensors& t, LayerNormBackward& a) {
                           a.din_fp8 = poisoned_codes(t, {s.M, s.C}, DType::F8E4M3);
                         }),
                 "layernorm_backward: argument 'din_fp8' has dtype fp8_e4m3, expected fp8_e5m2");
  expect_refusal(refusal(DType::BF16, s.M,
                         [&](DeviceTensors& t, LayerNormBackward& a) {
                           a.din_fp8_t = poisoned_codes(t, {s.M, s.C}, DType::F8E5M2);
                         }),
                 "argument 'din_fp8_t' must be [C, M] = [272, 48], got [48, 272]");
  expect_refusal(refusal(DType::BF16, s.M, [](DeviceTensors&, LayerNormBackward& a) { a.din_fp8_t = Tensor{}; }),
                 "argument 'din_fp8_t' is missing");
  expect_refusal(refusal(DType::BF16, s.M,
                         [&](DeviceTensors& t, LayerNormBackward& a) { a.product_dbias = t.poisoned({s.C + 1}); }),
                 "layernorm_backward: argument 'product_dbias' has 273 elements [273], expected 272");
  expect_refusal(refusal(DType::BF16, s.M, [](DeviceTensors&, LayerNormBackward& a) { a.fp8 = nullptr; }),
                 "layernorm_backward: fp8 codes of din or a product's bias gradient are given without 'fp8'");
  expect_refusal(refusal(DType::F32, s.M, none),
                 "layernorm_backward: an input gradient cast to fp8 needs bf16 or fp16, not fp32");
  expect_refusal(refusal(DType::BF16, 40, none),
                 "layernorm_backward: an input gradient cast to fp8 needs rows and columns multiples of 16, "
                 "got 40 x 272");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8LayerNormGradient, ::testing::ValuesIn(all_backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace kiln::testing
