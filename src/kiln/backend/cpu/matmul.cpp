// Matrix multiply with optional bias, through BLAS sgemm (row-major). Forward seeds the output
// with the bias and lets sgemm accumulate onto it (beta = 1), saving a pass. Backward computes
// din with beta = 0 (activation gradient, written) and dweight with beta = 1 (parameter
// gradient, accumulated), matching the conventions in ops.h. The GELU fusions are, in the
// reference, the GELU op after the product (forward; with gelu_fp8 the GELU op that casts) or on
// din (backward). fp8 products are the same products on the fp32 copies of the operands replaced
// by what their fp8 casts give back (or, given as codes, decode to). A din cast for its reader is
// the backward storing din, then the cast of din as stored.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/column_sums.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"
#include "kiln/core/fp8_codec.h"

namespace kiln {

namespace {
// values <- dec(fp8(values * scale)) * scale_inv in place, and amax <- max(amax, max |values|)
// (ops.h, fp8 products). `values` is an fp32 copy the op owns. With `codes_t` ([K, M] for values
// [M, K]), the fp8 codes are also kept there, transposed (ops.h, in_fp8_t).
void cast_through_fp8(const Tensor& values, const Fp8Operand& operand, DType format, const Tensor& codes_t = {}) {
  const fp8::Format f = format == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2;
  const float scale = *operand.scale.as<float>(), scale_inv = *operand.scale_inv.as<float>();
  float* x = values.as<float>();
  uint8_t* kept = codes_t.as<uint8_t>();
  const int64_t M = codes_t.empty() ? 0 : codes_t.shape[1], K = codes_t.empty() ? 0 : codes_t.shape[0];
  float amax = *operand.amax.as<float>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    const uint8_t code = fp8::encode(x[i] * scale, f);
    if (kept) kept[i % K * M + i / K] = code;
    x[i] = fp8::decode(code, f) * scale_inv;
  }
  *operand.amax.as<float>() = amax;
}

// in[m, k] <- dec(code) * scale_inv: `in` [M, K] as the cast gave it back, from its codes (E4M3,
// or E5M2 for a gradient's codes in that format), [M, K] or, transposed, [K, M] (the kept ones).
void decode_codes(const Tensor& codes, bool transposed, const Fp8Operand& operand, float* in) {
  const int64_t K = codes.shape[transposed ? 0 : codes.shape.rank - 1], M = codes.numel() / K;
  const fp8::Format format = codes.dtype == DType::F8E5M2 ? fp8::Format::E5M2 : fp8::Format::E4M3;
  const float scale_inv = *operand.scale_inv.as<float>();
  const uint8_t* bits = codes.as<uint8_t>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      in[m * K + k] = fp8::decode(bits[transposed ? k * M + m : m * K + k], format) * scale_inv;
}

void matmul_forward_fp32(const MatmulForward& args) {
  const auto [M, K, N] = checks::matmul_forward(args, Device::CPU);
  float* out = args.out.as<float>();
  float beta = 0.0f;
  if (!args.bias.empty() || !args.residual.empty()) {  // out starts as bias + residual; the product adds to it
    const float* bias = args.bias.empty() ? nullptr : args.bias.as<float>();
    const float* residual = args.residual.empty() ? nullptr : args.residual.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        out[m * N + n] = (bias ? bias[n] : 0.0f) + (residual ? residual[m * N + n] : 0.0f);
    beta = 1.0f;
  }
  const bool transposed = args.layout == WeightLayout::OutIn;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transposed ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
              args.in.as<float>(), K, args.weight.as<float>(), transposed ? K : N, beta, out, N);
}
}  // namespace

void CpuBackend::matmul_forward(const MatmulForward& args) {
  const auto [M, K, N] = checks::matmul_forward(args, Device::CPU);
  {
    Fp32Scope f(scratch_);  // fp8 takes 16-bit operands, so `in` and `weight` are copies here
    const bool in_codes = args.in.dtype == DType::F8E4M3;  // cast already (ops.h)
    Tensor in = in_codes ? Tensor{} : f.input(args.in);
    const Tensor weight = f.input(args.weight);
    if (in_codes) {
      in.shape = args.in.shape;
      in.data = scratch_.take(static_cast<size_t>(args.in.numel()));
      decode_codes(args.in, /*transposed=*/false, args.fp8->in, in.as<float>());
    } else if (args.fp8) {
      cast_through_fp8(in, args.fp8->in, DType::F8E4M3, args.in_fp8_t);
    }
    if (!args.weight_fp8.empty())  // cast already (ops.h): [N, K], the weight as OutIn stores it
      decode_codes(args.weight_fp8, /*transposed=*/args.layout == WeightLayout::InOut, args.fp8->weight,
                   weight.as<float>());
    else if (args.fp8)
      cast_through_fp8(weight, args.fp8->weight, DType::F8E4M3);
    MatmulForward product{f.output(args.out), in, weight, f.input(args.bias), args.layout};
    product.residual = f.input(args.residual);
    matmul_forward_fp32(product);
    f.write_back();
  }
  if (args.gelu_fp8) {  // GELU of out as stored, cast as the GELU op would (ops.h)
    gelu_forward({args.gelu_out, args.out.reshaped({M, N}), args.gelu_fp8, args.gelu_out_t});
  } else if (!args.gelu_out.empty()) {
    gelu_forward({args.gelu_out, args.out});  // the reference: the two ops in turn
  }
}

namespace {
void matmul_backward_fp32(const MatmulBackward& args) {
  const auto [M, K, N] = checks::matmul_backward(args, Device::CPU);
  const float* dout = args.dout.as<float>();
  const float* in = args.in.as<float>();
  const float* weight = args.weight.as<float>();
  const bool in_out = args.layout == WeightLayout::InOut;
  if (!args.din.empty()) {
    // din[M,K] = dout[M,N] @ W^T where W is [K,N] (InOut), or dout @ W where W is [N,K] (OutIn).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, in_out ? CblasTrans : CblasNoTrans, M, K, N, 1.0f, dout,
                N, weight, in_out ? N : K, 0.0f, args.din.as<float>(), K);
  }
  if (in_out) {  // dW[K,N] += in^T @ dout
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1.0f, in, K, dout, N, 1.0f,
                args.dweight.as<float>(), N);
  } else {       // dW[N,K] += dout^T @ in
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, in, K, 1.0f,
                args.dweight.as<float>(), K);
  }
  if (!args.dbias.empty()) add_column_sums(args.dbias.as<float>(), dout, M, N);
}
}  // namespace

void CpuBackend::matmul_backward(const MatmulBackward& args) {
  const auto [M, K, N] = checks::matmul_backward(args, Device::CPU);
  if (args.din_reader) {  // the backward storing din, then din as stored cast for its reader (ops.h)
    std::vector<uint16_t> stored(static_cast<size_t>(M * K));  // the compute dtype is 16-bit (checked)
    MatmulBackward storing = args;
    storing.din = Tensor{stored.data(), Shape{M, K}, args.weight.dtype, Device::CPU};
    storing.din_reader = nullptr;
    storing.din_fp8 = storing.din_fp8_t = storing.reader_dbias = Tensor{};
    CpuBackend::matmul_backward(storing);  // this back-end's, not an override's: one op
    zero_to_write(args.param_store, {args.reader_dbias});
    Fp32Scope f(scratch_);
    const Tensor din = f.input(storing.din);
    cast_output_to_fp8(din, args.weight.dtype, args.din_reader->dout, args.din_reader->grad_dtype, args.din_fp8,
                       args.din_fp8_t, scratch_);
    if (!args.reader_dbias.empty()) add_column_sums(args.reader_dbias.as<float>(), din.as<float>(), M, K);
    return;
  }
  zero_to_write(args.param_store, {args.dweight, args.dbias});
  {
    Fp32Scope f(scratch_);
    const bool dout_codes = !args.dout_fp8_t.empty();  // cast already (ops.h)
    const Tensor dout =
        dout_codes ? Tensor{scratch_.take(static_cast<size_t>(M * N)), Shape{M, N}} : f.input(args.dout);
    const Tensor weight = f.input(args.weight);
    const bool codes_kept = !args.in_fp8_t.empty();
    const Tensor in = codes_kept ? Tensor{scratch_.take(static_cast<size_t>(M * K)), Shape{M, K}} : f.input(args.in);
    if (!args.fp8) {
      matmul_backward_fp32({f.output(args.din), args.dweight, args.dbias, dout, in, weight, args.layout});
    } else {  // the bias gradient from dout before its cast
      if (!args.dbias.empty()) add_column_sums(args.dbias.as<float>(), dout.as<float>(), M, N);
      if (dout_codes) decode_codes(args.dout, /*transposed=*/false, args.fp8->dout, dout.as<float>());
      else cast_through_fp8(dout, args.fp8->dout, args.fp8->grad_dtype);
      if (codes_kept) decode_codes(args.in_fp8_t, /*transposed=*/true, args.fp8->in, in.as<float>());
      else cast_through_fp8(in, args.fp8->in, DType::F8E4M3);
      if (!args.weight_fp8.empty())  // cast already (ops.h): [K, N], the weight as InOut stores it
        decode_codes(args.weight_fp8, /*transposed=*/args.layout == WeightLayout::OutIn, args.fp8->weight,
                     weight.as<float>());
      else
        cast_through_fp8(weight, args.fp8->weight, DType::F8E4M3);
      matmul_backward_fp32({f.output(args.din), args.dweight, Tensor{}, dout, in, weight, args.layout});
    }
    f.write_back();
  }
  if (!args.gelu_in.empty()) gelu_backward({args.din, args.gelu_in, args.din});  // in place
}

}  // namespace kiln
