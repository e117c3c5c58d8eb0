// fp8 products (ops.h) on every back-end against a double-precision reference built from the fp8
// codec (core/fp8_codec.h, tested code by code in dtype_test.cpp): the products of the cast
// operands with the scales taken back out, the bias, its gradient and GELU's derivative from the
// values before the casts, each cast tensor's max |x| folded into its amax, both weight layouts,
// E5M2 and E4M3 gradients; `in`'s codes kept by a forward (in_fp8_t) and a backward from them alone
// bit for bit the backward that casts `in` itself; the weight cast once by a Convert (weight_fp8)
// and products from those codes bit for bit the products that cast it; an input gradient cast for
// the product reading it next bit for bit that product casting it. And fp8_update_scales' rule on
// hand-computed rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kiln/backend/registry.h"
#include "kiln/core/fp8_codec.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 48, K = 64, N = 32;

// dec(fp8(x * scale)) * scale_inv, as the casts compute it (fp32 product, then the codec).
double cast(float x, float scale, float scale_inv, DType format) {
  const fp8::Format f = format == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2;
  return double{fp8::decode(fp8::encode(x * scale, f), f)} * scale_inv;
}

double gelu_derivative(double x) {  // tanh approximation, as ops.h
  const double inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(inner);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

float largest_magnitude(const std::vector<float>& values) {
  float largest = 0.0f;
  for (float value : values) largest = std::max(largest, std::fabs(value));
  return largest;
}

struct Scale {
  float scale, amax_before;
};

// One Fp8Operand in back-end memory.
Fp8Operand operand(DeviceTensors& t, Scale s) {
  return {t.floats({s.scale}, {1}), t.floats({1.0f / s.scale}, {1}),
          t.floats({s.amax_before}, {1})};
}

using Case = std::tuple<std::string, WeightLayout, DType>;

class Fp8Products : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(std::get<0>(GetParam()));
    if (!reason.empty()) GTEST_SKIP() << reason;
    backend_ = make_backend(std::get<0>(GetParam()));
    Rng rng(21);
    // bf16 values, so the reference sees what the tensors hold.
    in_ = rounded_to(DType::BF16, random_floats(M * K, rng));
    weight_ = rounded_to(DType::BF16, random_floats(K * N, rng, 0.1f));
    bias_ = rounded_to(DType::BF16, random_floats(N, rng));
    dout_ = rounded_to(DType::BF16, random_floats(M * N, rng, 1e-3f));
    gelu_in_ = rounded_to(DType::BF16, random_floats(M * K, rng));
  }
  // Element (k, n) of the [K, N] weight, whichever way it is stored.
  float weight(int64_t k, int64_t n) const {
    return layout() == WeightLayout::InOut ? weight_[k * N + n] : weight_[n * K + k];
  }
  WeightLayout layout() const { return std::get<1>(GetParam()); }
  Shape weight_shape() const { return layout() == WeightLayout::InOut ? Shape{K, N} : Shape{N, K}; }

  // Scales: powers of two for `in` and the weight, 3 (an inexact inverse) for dout; amax starting
  // below the tensors' max for two, above it for the third (it must stay).
  const Scale in_scale_{4.0f, 0.5f}, weight_scale_{32.0f, 0.0f}, dout_scale_{3000.0f, 100.0f};
  std::unique_ptr<Backend> backend_;
  std::vector<float> in_, weight_, bias_, dout_, gelu_in_;
};

TEST_P(Fp8Products, ForwardIsTheProductOfTheCastOperands) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, {1.0f, 0.0f})};
  const Tensor out = t.poisoned_acts({M, N});
  backend_->matmul_forward({out, t.acts(in_, {M, K}), t.acts(weight_, weight_shape()),
                            t.acts(bias_, {N}), layout(), Tensor{}, &fp8});
  std::vector<double> expected(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = bias_[n];
      for (int64_t k = 0; k < K; ++k)
        sum += cast(in_[m * K + k], 4.0f, 0.25f, DType::F8E4M3) *
               cast(weight(k, n), 32.0f, 1.0f / 32, DType::F8E4M3);
      expected[m * N + n] = sum;
    }
  EXPECT_LT(normalized_error(t.download(out), expected), 1e-2);  // bf16 output
  EXPECT_EQ(t.download(fp8.in.amax)[0], largest_magnitude(in_));
  EXPECT_EQ(t.download(fp8.weight.amax)[0], largest_magnitude(weight_));
  EXPECT_EQ(t.download(fp8.in.scale)[0], 4.0f);  // read, not written
}

TEST_P(Fp8Products, BackwardCastsTheOutputGradientToItsFormat) {
  const DType grad = std::get<2>(GetParam());
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_),
                      grad};
  const Tensor din = t.poisoned_acts({M, K});
  const Tensor dweight = t.floats(std::vector<float>(K * N, 0.5f), weight_shape());
  const Tensor dbias = t.floats(std::vector<float>(N, 0.25f), {N});
  backend_->matmul_backward({din, dweight, dbias, t.acts(dout_, {M, N}), t.acts(in_, {M, K}),
                             t.acts(weight_, weight_shape()), layout(), t.acts(gelu_in_, {M, K}),
                             &fp8});
  const auto dq = [&](int64_t m, int64_t n) {
    return cast(dout_[m * N + n], 3000.0f, 1.0f / 3000, grad);
  };
  std::vector<double> expected_din(M * K), expected_dweight(K * N), expected_dbias(N, 0.25);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double sum = 0;
      for (int64_t n = 0; n < N; ++n)
        sum += dq(m, n) * cast(weight(k, n), 32.0f, 1.0f / 32, DType::F8E4M3);
      expected_din[m * K + k] = sum * gelu_derivative(gelu_in_[m * K + k]);
    }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.5;
      for (int64_t m = 0; m < M; ++m)
        sum += cast(in_[m * K + k], 4.0f, 0.25f, DType::F8E4M3) * dq(m, n);
      expected_dweight[layout() == WeightLayout::InOut ? k * N + n : n * K + k] = sum;
    }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) expected_dbias[n] += dout_[m * N + n];  // before the cast
  EXPECT_LT(normalized_error(t.download(din), expected_din), 1e-2);
  EXPECT_LT(normalized_error(t.download(dweight), expected_dweight), 1e-5);  // fp32 accumulation
  EXPECT_LT(normalized_error(t.download(dbias), expected_dbias), 1e-5);
  EXPECT_EQ(t.download(fp8.dout.amax)[0], 100.0f);  // above every |dout|: kept
  EXPECT_EQ(t.download(fp8.in.amax)[0], largest_magnitude(in_));
}

// Codes of `in` kept for a backward, [K, M]: every byte a NaN code until the forward writes it.
Tensor poisoned_codes(DeviceTensors& t) {
  return t.upload(std::vector<uint8_t>(K * M, 0x7F), {K, M}, DType::F8E4M3);
}

TEST_P(Fp8Products, ForwardKeepsTheInputsCodesTransposed) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, {1.0f, 0.0f})};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape()), bias = t.acts(bias_, {N});
  const Tensor plain = t.poisoned_acts({M, N}), keeping = t.poisoned_acts({M, N}), codes = poisoned_codes(t);
  backend_->matmul_forward({plain, in, weight, bias, layout(), Tensor{}, &fp8});
  backend_->matmul_forward({keeping, in, weight, bias, layout(), Tensor{}, &fp8, codes});
  EXPECT_EQ(t.download(keeping), t.download(plain));
  const std::vector<float> kept = t.download(codes);  // the codes' values, before the scale comes out
  std::vector<float> expected(K * M);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      expected[k * M + m] = fp8::decode(fp8::encode(in_[m * K + k] * 4.0f, fp8::Format::E4M3), fp8::Format::E4M3);
  EXPECT_EQ(kept, expected);
  EXPECT_EQ(t.download(fp8.in.amax)[0], largest_magnitude(in_));
}

TEST_P(Fp8Products, BackwardFromKeptCodesIsTheBackwardFromTheInput) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_),
                      std::get<2>(GetParam())};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape()), codes = poisoned_codes(t);
  backend_->matmul_forward({t.poisoned_acts({M, N}), in, weight, Tensor{}, layout(), Tensor{}, &fp8, codes});
  const float amax_after_forward = t.download(fp8.in.amax)[0];
  struct Gradients {
    Tensor din, dweight, dbias;
  };
  const auto backward = [&](const Tensor& input, const Tensor& kept_codes) {
    const Gradients g{t.poisoned_acts({M, K}), t.floats(std::vector<float>(K * N, 0.5f), weight_shape()),
                      t.floats(std::vector<float>(N, 0.25f), {N})};
    backend_->matmul_backward({g.din, g.dweight, g.dbias, t.acts(dout_, {M, N}), input, weight, layout(),
                               t.acts(gelu_in_, {M, K}), &fp8, kept_codes});
    return g;
  };
  const Gradients from_codes = backward(Tensor{}, codes);
  EXPECT_EQ(t.download(fp8.in.amax)[0], amax_after_forward);  // `in` was not cast again
  const Gradients from_input = backward(in, Tensor{});
  EXPECT_EQ(t.download(from_codes.din), t.download(from_input.din));
  EXPECT_EQ(t.download(from_codes.dweight), t.download(from_input.dweight));
  EXPECT_EQ(t.download(from_codes.dbias), t.download(from_input.dbias));
}

TEST_P(Fp8Products, KeptCodesOfTheWrongShapeOrWithoutFp8AreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_)};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape());
  const Tensor untransposed = t.upload(std::vector<uint8_t>(M * K, 0), {M, K}, DType::F8E4M3);
  const std::string shape_error = error_of([&] {
    backend_->matmul_forward({t.poisoned_acts({M, N}), in, weight, Tensor{}, layout(), Tensor{}, &fp8, untransposed});
  });
  EXPECT_NE(shape_error.find("matmul_forward: argument 'in_fp8_t' must be [K, M] = [64, 48], got [48, 64]"),
            std::string::npos)
      << shape_error;
  const std::string no_fp8 = error_of([&] {
    backend_->matmul_backward({t.poisoned_acts({M, K}), t.floats(std::vector<float>(K * N, 0.0f), weight_shape()),
                               Tensor{}, t.acts(dout_, {M, N}), Tensor{}, weight, layout(), Tensor{}, nullptr,
                               poisoned_codes(t)});
  });
  EXPECT_NE(no_fp8.find("matmul_backward: argument 'in_fp8_t' (fp8 codes of the input) is given to a product "
                        "without fp8"),
            std::string::npos)
      << no_fp8;
}

TEST_P(Fp8Products, DimensionsOffMultiplesOf16AreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_)};
  constexpr int64_t rows = 40;  // not a multiple of 16
  const std::string error = error_of([&] {
    backend_->matmul_forward({t.poisoned_acts({rows, N}),
                              t.acts(std::vector<float>(rows * K, 1.0f), {rows, K}),
                              t.acts(weight_, weight_shape()), Tensor{}, layout(), Tensor{}, &fp8});
  });
  EXPECT_NE(error.find("fp8 products need M, K and N multiples of 16, got 40 x 64 x 32"),
            std::string::npos)
      << error;
}

// cuBLASLt reads an fp8 product's factors (scale_inv) only 16-byte aligned (cuda/lt_matmul.h), so
// every back-end refuses one that is not, by the argument's name.
TEST_P(Fp8Products, AScaleInverseLessThan16ByteAlignedIsRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_)};
  const Tensor factors = t.floats({0.0f, 1.0f / 32, 0.0f, 0.0f}, {4});
  fp8.weight.scale_inv = factors.slice(1, 1);  // 4 bytes into 16
  const std::string error = error_of([&] {
    backend_->matmul_forward({t.poisoned_acts({M, N}), t.acts(in_, {M, K}), t.acts(weight_, weight_shape()),
                              Tensor{}, layout(), Tensor{}, &fp8});
  });
  EXPECT_NE(error.find("argument 'fp8 weight scale_inv' must be 16-byte aligned"), std::string::npos) << error;
}

// The weight cast already (ops.h, weight_fp8): a Convert with fp8 casts it once, in both layouts,
// as the products would; products reading those codes give bit for bit what products casting the
// weight give, never read the weight itself (NaN here) and leave its amax to the Convert.
struct WeightCodes {
  Tensor forward, backward;  // [N, K] and [K, N]
};
WeightCodes convert_weight(Backend& backend, DeviceTensors& t, const Tensor& weight, const Fp8Operand& fp8,
                           WeightLayout layout) {
  const Tensor rows = t.upload(std::vector<uint8_t>(K * N, 0x7F), weight.shape, DType::F8E4M3);
  const Tensor columns =
      t.upload(std::vector<uint8_t>(K * N, 0x7F), {weight.shape[1], weight.shape[0]}, DType::F8E4M3);
  backend.convert({rows, weight, &fp8, columns});
  // As stored, the weight is [N, K] with OutIn, [K, N] with InOut.
  return layout == WeightLayout::OutIn ? WeightCodes{rows, columns} : WeightCodes{columns, rows};
}

TEST_P(Fp8Products, ConvertCastsAMatrixAsTheProductsWould) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Operand fp8 = operand(t, weight_scale_);
  const WeightCodes codes = convert_weight(*backend_, t, t.acts(weight_, weight_shape()), fp8, layout());
  std::vector<float> forward(N * K), backward(K * N);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      forward[n * K + k] = backward[k * N + n] =
          fp8::decode(fp8::encode(weight(k, n) * 32.0f, fp8::Format::E4M3), fp8::Format::E4M3);
  EXPECT_EQ(t.download(codes.forward), forward);
  EXPECT_EQ(t.download(codes.backward), backward);
  EXPECT_EQ(t.download(fp8.amax)[0], largest_magnitude(weight_));
  EXPECT_EQ(t.download(fp8.scale)[0], 32.0f);  // read, not written
  // One layout alone.
  const Tensor only = t.upload(std::vector<uint8_t>(K * N, 0x7F), weight_shape(), DType::F8E4M3);
  backend_->convert({only, t.acts(weight_, weight_shape()), &fp8});
  EXPECT_EQ(t.download(only), t.download(layout() == WeightLayout::OutIn ? codes.forward : codes.backward));
}

TEST_P(Fp8Products, ProductsFromTheWeightsCodesAreTheProductsThatCastIt) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_),
                      std::get<2>(GetParam())};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape()), bias = t.acts(bias_, {N});
  const Tensor unread = t.poisoned_acts(weight_shape());  // the weight's shape, NaN: never read
  const WeightCodes codes = convert_weight(*backend_, t, weight, fp8.weight, layout());
  const float weight_amax = t.download(fp8.weight.amax)[0];
  EXPECT_EQ(weight_amax, largest_magnitude(weight_));

  const Tensor from_codes = t.poisoned_acts({M, N});
  MatmulForward forward{from_codes, in, unread, bias, layout(), Tensor{}, &fp8};
  forward.weight_fp8 = codes.forward;
  backend_->matmul_forward(forward);
  const Tensor casting = t.poisoned_acts({M, N});
  backend_->matmul_forward({casting, in, weight, bias, layout(), Tensor{}, &fp8});
  EXPECT_EQ(t.download(from_codes), t.download(casting));

  struct Gradients {
    Tensor din, dweight, dbias;
  };
  const auto backward = [&](const Tensor& weight_read, const Tensor& weight_codes) {
    const Gradients g{t.poisoned_acts({M, K}), t.floats(std::vector<float>(K * N, 0.5f), weight_shape()),
                      t.floats(std::vector<float>(N, 0.25f), {N})};
    MatmulBackward pass{g.din, g.dweight, g.dbias, t.acts(dout_, {M, N}), in, weight_read, layout(),
                        t.acts(gelu_in_, {M, K}), &fp8};
    pass.weight_fp8 = weight_codes;
    backend_->matmul_backward(pass);
    return g;
  };
  backend_->fill({fp8.weight.amax, 0.0f});
  const Gradients read = backward(unread, codes.backward);
  EXPECT_EQ(t.download(fp8.weight.amax)[0], 0.0f) << "the weight's codes were cast already, its amax folded";
  const Gradients cast_here = backward(weight, Tensor{});
  EXPECT_EQ(t.download(read.din), t.download(cast_here.din));
  EXPECT_EQ(t.download(read.dweight), t.download(cast_here.dweight));
  EXPECT_EQ(t.download(read.dbias), t.download(cast_here.dbias));
  EXPECT_EQ(t.download(fp8.weight.amax)[0], weight_amax);
}

// A product whose input gradient is cast for its reader (ops.h, din_reader: the MLP's c_proj for
// c_fc) against the two ops in turn: the product storing din (GELU's derivative applied), then the
// reader's backward casting that din as its output gradient. Bit for bit: the product's own
// gradients, the reader's gradients and bias gradient, the reader's dout amax, and the codes, which
// are the cast of the stored din.
TEST_P(Fp8Products, AnInputGradientCastForItsReaderIsTheReadersCastOfTheStoredOne) {
  DeviceTensors t(*backend_, DType::BF16);
  const DType format = std::get<2>(GetParam());
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_), format};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape()), dout = t.acts(dout_, {M, N});
  const Tensor gelu_in = t.acts(gelu_in_, {M, K});
  // The reader: [M, N] -> [M, K] (InOut weight [N, K]), reading the product's din as its dout.
  const std::vector<float> reader_in(in_.begin(), in_.begin() + M * N);
  const Tensor r_in = t.acts(reader_in, {M, N}), r_weight = t.acts(weight_, {N, K});
  const Scale reader_dout_scale{4000.0f, 0.0f};
  struct Run {
    Tensor dweight, r_din, r_dweight, r_dbias;
    Fp8Matmul reader;
  };
  const auto run = [&](bool cast_for_reader) {
    Run r{t.floats(std::vector<float>(K * N, 0.5f), weight_shape()), t.poisoned_acts({M, N}),
          t.floats(std::vector<float>(N * K, 0.5f), {N, K}), t.floats(std::vector<float>(K, 0.25f), {K}),
          Fp8Matmul{operand(t, in_scale_), operand(t, weight_scale_), operand(t, reader_dout_scale), format}};
    MatmulBackward product{t.poisoned_acts({M, K}), r.dweight, Tensor{}, dout, in, weight, layout(), gelu_in, &fp8};
    MatmulBackward reader{r.r_din, r.r_dweight, r.r_dbias, product.din, r_in, r_weight, WeightLayout::InOut,
                          Tensor{}, &r.reader};
    if (cast_for_reader) {
      const Tensor rows = t.upload(std::vector<uint8_t>(M * K, 0x7F), {M, K}, format);
      const Tensor columns = t.upload(std::vector<uint8_t>(M * K, 0x7F), {K, M}, format);
      product.din = Tensor{};
      product.din_reader = &r.reader;
      product.din_fp8 = rows;
      product.din_fp8_t = columns;
      product.reader_dbias = r.r_dbias;
      reader.dout = rows;
      reader.dout_fp8_t = columns;
      reader.dbias = Tensor{};
      backend_->matmul_backward(product);
      // The codes are the cast of din as the other run stores it (checked below through the reader).
      const std::vector<float> row_codes = t.download(rows), column_codes = t.download(columns);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) EXPECT_EQ(row_codes[m * K + k], column_codes[k * M + m]) << m << ", " << k;
    } else {
      backend_->matmul_backward(product);
    }
    backend_->matmul_backward(reader);
    return r;
  };
  const Run stored = run(false), cast = run(true);
  EXPECT_EQ(t.download(cast.dweight), t.download(stored.dweight));
  EXPECT_EQ(t.download(cast.r_din), t.download(stored.r_din));
  EXPECT_EQ(t.download(cast.r_dweight), t.download(stored.r_dweight));
  EXPECT_EQ(t.download(cast.r_dbias), t.download(stored.r_dbias));
  const float amax = t.download(cast.reader.dout.amax)[0];
  EXPECT_EQ(amax, t.download(stored.reader.dout.amax)[0]);
  EXPECT_GT(amax, 0.0f);
  EXPECT_NE(t.download(cast.r_dbias), std::vector<float>(K, 0.25f)) << "the reader's bias gradient was added";
}

TEST_P(Fp8Products, AnInputGradientCastWithoutAnFp8ProductOrBesideDinOrDbiasIsRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_)};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape());
  const Tensor rows = t.upload(std::vector<uint8_t>(M * K, 0), {M, K}, DType::F8E5M2);
  const Tensor columns = t.upload(std::vector<uint8_t>(M * K, 0), {K, M}, DType::F8E5M2);
  const auto error = [&](auto change) {
    MatmulBackward pass{Tensor{}, t.floats(std::vector<float>(K * N, 0.0f), weight_shape()), Tensor{},
                        t.acts(dout_, {M, N}), in, weight, layout(), Tensor{}, &fp8};
    pass.din_reader = &fp8;
    pass.din_fp8 = rows;
    pass.din_fp8_t = columns;
    change(pass);
    return error_of([&] { backend_->matmul_backward(pass); });
  };
  EXPECT_NE(error([](MatmulBackward& p) { p.fp8 = nullptr; })
                .find("matmul_backward: argument 'din_reader' is given without 'fp8'"),
            std::string::npos);
  EXPECT_NE(error([&](MatmulBackward& p) { p.din = t.poisoned_acts({M, K}); })
                .find("matmul_backward: argument 'din' is given with 'din_reader'"),
            std::string::npos);
  EXPECT_NE(error([&](MatmulBackward& p) { p.dbias = t.floats(std::vector<float>(N, 0.0f), {N}); })
                .find("matmul_backward: argument 'dbias' is given with 'din_reader'"),
            std::string::npos);
  EXPECT_NE(error([&](MatmulBackward& p) { p.din_fp8_t = rows; })
                .find("matmul_backward: argument 'din_fp8_t' must be [K, M] = [64, 48], got [48, 64]"),
            std::string::npos);
  EXPECT_NE(error([&](MatmulBackward& p) { p.din_reader = nullptr; })
                .find("matmul_backward: fp8 codes of din or a reader's bias gradient are given without 'din_reader'"),
            std::string::npos);
}

TEST_P(Fp8Products, WeightCodesOfTheWrongShapeOrWithoutAnFp8ProductAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Matmul fp8{operand(t, in_scale_), operand(t, weight_scale_), operand(t, dout_scale_)};
  const Tensor in = t.acts(in_, {M, K}), weight = t.acts(weight_, weight_shape());
  const WeightCodes codes = convert_weight(*backend_, t, weight, fp8.weight, layout());
  const auto forward_error = [&](const Tensor& weight_codes, const Fp8Matmul* product) {
    MatmulForward forward{t.poisoned_acts({M, N}), in, weight, Tensor{}, layout(), Tensor{}, product};
    forward.weight_fp8 = weight_codes;
    return error_of([&] { backend_->matmul_forward(forward); });
  };
  EXPECT_NE(forward_error(codes.backward, &fp8).find(
                "matmul_forward: argument 'weight_fp8' must be [N, K] = [32, 64], got [64, 32]"),
            std::string::npos);
  EXPECT_NE(forward_error(codes.forward, nullptr).find("matmul_forward: argument 'weight_fp8' (fp8 codes of the "
                                                       "weight) is given to a product without fp8"),
            std::string::npos);
  const auto backward_error = [&](const Tensor& din, const Tensor& weight_codes) {
    MatmulBackward pass{din, t.floats(std::vector<float>(K * N, 0.0f), weight_shape()), Tensor{},
                        t.acts(dout_, {M, N}), in, weight, layout(), Tensor{}, &fp8};
    pass.weight_fp8 = weight_codes;
    return error_of([&] { backend_->matmul_backward(pass); });
  };
  EXPECT_NE(backward_error(t.poisoned_acts({M, K}), codes.forward)
                .find("matmul_backward: argument 'weight_fp8' must be [K, N] = [64, 32], got [32, 64]"),
            std::string::npos);
  EXPECT_NE(backward_error(Tensor{}, codes.backward)
                .find("matmul_backward: argument 'weight_fp8' is given without 'din'"),
            std::string::npos);
}

TEST_P(Fp8Products, ConvertsToFp8OfNoMatrixOrOddSidesAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Fp8Operand fp8 = operand(t, weight_scale_);
  const auto error = [&](const Convert& args) { return error_of([&] { backend_->convert(args); }); };
  const Tensor codes = t.upload(std::vector<uint8_t>(K * N, 0), {K, N}, DType::F8E4M3);
  EXPECT_NE(error({codes.reshaped({K * N}), t.acts(weight_, {K * N}), &fp8})
                .find("convert: a cast to fp8 takes a matrix [R, C], got 'in' [2048]"),
            std::string::npos);
  EXPECT_NE(error({codes.reshaped({K * N / 8, 8}), t.acts(weight_, {K * N / 8, 8}), &fp8})
                .find("convert: a matrix cast to fp8 needs R and C multiples of 16, got 256 x 8"),
            std::string::npos);
  EXPECT_NE(error({Tensor{}, t.acts(weight_, {K, N}), &fp8}).find("'fp8' is given without 'out' or 'out_t'"),
            std::string::npos);
  EXPECT_NE(error({codes, t.acts(weight_, {K, N}), &fp8, codes})
                .find("convert: argument 'out_t' must be [C, R] = [32, 64], got [64, 32]"),
            std::string::npos);
  EXPECT_NE(error({t.poisoned_acts({K, N}), t.acts(weight_, {K, N}), nullptr, codes})
                .find("convert: argument 'out_t' is given without 'fp8'"),
            std::string::npos);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) +
         (std::get<1>(info.param) == WeightLayout::InOut ? "_in_out_" : "_out_in_") +
         std::string(dtype_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8Products,
                         ::testing::Combine(::testing::ValuesIn(all_backend_names()),
                                            ::testing::Values(WeightLayout::InOut,
                                                              WeightLayout::OutIn),
                                            ::testing::Values(DType::F8E5M2, DType::F8E4M3)),
                         case_name);

class Fp8Scaling : public OnEachBackend {};

TEST_P(Fp8Scaling, NextScalesFollowTheAmaxHistory) {
  DeviceTensors t(*backend_);
  // Rows [scale, scale_inv, amax, fp8_max, history x 3].
  const Tensor state =
      t.floats({3.0f, 1.0f / 3, 8.0f, 448.0f,   1.0f,   4.0f, 2.0f,   // E4M3: max(1, 8, 2) = 8
                3.0f, 1.0f / 3, 0.0f, 57344.0f, 0.0f,   0.0f, 0.0f,   // nothing seen: kept
                3.0f, 1.0f / 3, 2.0f, 448.0f,   100.0f, 0.0f, 0.0f},  // 100 still in the history
               {3, 7});
  backend_->fp8_update_scales({state, /*position=*/1, /*use_history_max=*/true, /*margin=*/1});
  EXPECT_EQ(t.download(state),
            (std::vector<float>{28.0f, 1.0f / 28,    0.0f, 448.0f,   1.0f,   8.0f, 2.0f,  //
                                3.0f,  1.0f / 3,     0.0f, 57344.0f, 0.0f,   0.0f, 0.0f,  //
                                2.24f, 1.0f / 2.24f, 0.0f, 448.0f,   100.0f, 2.0f, 0.0f}));
  const Tensor recent = t.floats({3.0f, 1.0f / 3, 2.0f, 448.0f, 100.0f}, {1, 5});
  backend_->fp8_update_scales({recent, 0, /*use_history_max=*/false, 0});
  EXPECT_EQ(t.download(recent), (std::vector<float>{224.0f, 1.0f / 224, 0.0f, 448.0f, 2.0f}));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8Scaling, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
