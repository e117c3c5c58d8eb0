// LayerNorm (Ba et al. 2016) over the channel axis. Forward keeps mean and 1/std per row so the
// backward needs no second pass over statistics. Parameter gradients are column-parallel sums in
// row order, so they are identical for any thread count. The row and column loops run in the
// vector units of the machine (vector_math.h).
#include <algorithm>
#include <cmath>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/column_sums.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"
#include "kiln/backend/cpu/vector_math.h"

namespace kiln {

namespace {
struct RowStatistics {
  float mean, rstd;
};

// out = (row - mean) rstd weight + bias over one row of C channels. The sums run in the vector
// units (their order fixed by the clone, not by the thread count).
KILN_VECTOR_CLONES RowStatistics normalize_row(const float* row, float* out, const float* weight, const float* bias,
                                               int64_t C, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += row[c];
  const float mean = sum / static_cast<float>(C);
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t c = 0; c < C; ++c) squares += (row[c] - mean) * (row[c] - mean);
  const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
  for (int64_t c = 0; c < C; ++c) out[c] = (row[c] - mean) * rstd * weight[c] + bias[c];
  return {mean, rstd};
}

void layernorm_forward_fp32(const LayerNormForward& args) {
  const auto [M, C] = checks::layernorm_forward(args, Device::CPU);
  const float* in = args.in.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const RowStatistics statistics =
        normalize_row(in + m * C, out + m * C, args.weight.as<float>(), args.bias.as<float>(), C, args.eps);
    args.mean.as<float>()[m] = statistics.mean;
    args.rstd.as<float>()[m] = statistics.rstd;
  }
}

}  // namespace

void CpuBackend::layernorm_forward(const LayerNormForward& args) {
  const auto [M, C] = checks::layernorm_forward(args, Device::CPU);
  Fp32Scope f(scratch_);
  // With fp8 the output is only cast (ops.h): it takes fp32 scratch of its own.
  const Tensor out = args.fp8 ? Tensor{scratch_.take(static_cast<size_t>(M * C)), {M, C}, DType::F32, Device::CPU}
                              : f.output(args.out);
  layernorm_forward_fp32({out, args.mean, args.rstd, f.input(args.in), f.input(args.weight), f.input(args.bias),
                          args.eps});
  if (args.fp8)
    cast_output_to_fp8(out, args.in.dtype, *args.fp8, DType::F8E4M3, args.out_fp8, args.out_fp8_t, scratch_);
  f.write_back();
}

namespace {
// din_row += rstd (g - mean(g) - xhat mean(g xhat)), g = dout weight, over one row of C channels.
KILN_VECTOR_CLONES void add_row_input_gradient(float* din_row, const float* row, const float* grad,
                                               const float* weight, RowStatistics statistics, int64_t C) {
  const auto [mean, rstd] = statistics;
  float grad_mean = 0.0f, grad_dot_xhat = 0.0f;
#pragma omp simd reduction(+ : grad_mean, grad_dot_xhat)
  for (int64_t c = 0; c < C; ++c) {
    const float g = grad[c] * weight[c];
    grad_mean += g;
    grad_dot_xhat += g * (row[c] - mean) * rstd;
  }
  grad_mean /= static_cast<float>(C);
  grad_dot_xhat /= static_cast<float>(C);
  for (int64_t c = 0; c < C; ++c) {
    const float xhat = (row[c] - mean) * rstd;
    din_row[c] += rstd * (grad[c] * weight[c] - grad_mean - xhat * grad_dot_xhat);
  }
}

// Channels [c0, c0 + width) of the weight and bias gradients, each summed over the rows from row 0
// up, width <= kColumnBlock.
constexpr int64_t kColumnBlock = 64;
KILN_VECTOR_CLONES void add_parameter_gradients(float* dweight, float* dbias, const float* in, const float* dout,
                                                const float* means, const float* rstds, int64_t M, int64_t C,
                                                int64_t c0, int64_t width) {
  float weight_sums[kColumnBlock] = {}, bias_sums[kColumnBlock] = {};
  for (int64_t m = 0; m < M; ++m) {
    const float *grad = dout + m * C + c0, *row = in + m * C + c0;
    const float mean = means[m], rstd = rstds[m];
    for (int64_t c = 0; c < width; ++c) {
      weight_sums[c] += grad[c] * (row[c] - mean) * rstd;
      bias_sums[c] += grad[c];
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    dweight[c0 + c] += weight_sums[c];
    dbias[c0 + c] += bias_sums[c];
  }
}

void layernorm_backward_fp32(const LayerNormBackward& args) {
  const auto [M, C] = checks::layernorm_backward(args, Device::CPU);
  const float* in = args.in.as<float>();
  const float* dout = args.dout.as<float>();
  const float* means = args.mean.as<float>();
  const float* rstds = args.rstd.as<float>();
  float* din = args.din.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m)
    add_row_input_gradient(din + m * C, in + m * C, dout + m * C, args.weight.as<float>(), {means[m], rstds[m]}, C);
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock)
    add_parameter_gradients(args.dweight.as<float>(), args.dbias.as<float>(), in, dout, means, rstds, M, C, c0,
                            std::min(kColumnBlock, C - c0));
}
}  // namespace

// With fp8, din is then cast as the next product's backward would cast it, and that backward's
// bias gradient taken from the rounded values, as the backward would take it (ops.h).
void CpuBackend::layernorm_backward(const LayerNormBackward& args) {
  const auto [M, C] = checks::layernorm_backward(args, Device::CPU);
  zero_to_write(args.param_store, {args.dweight, args.dbias, args.product_dbias});
  zero_to_write(args.din_store, {args.din});
  Fp32Scope f(scratch_);
  const Tensor din = f.accumulated(args.din);
  layernorm_backward_fp32({din, args.dweight, args.dbias, f.input(args.dout), f.input(args.in), f.input(args.weight),
                           args.mean, args.rstd});
  if (args.fp8) {
    const Tensor rows = din.reshaped({M, C});
    cast_output_to_fp8(rows, args.in.dtype, args.fp8->dout, args.fp8->grad_dtype, args.din_fp8, args.din_fp8_t,
                       scratch_);
    if (!args.product_dbias.empty()) add_column_sums(args.product_dbias.as<float>(), rows.as<float>(), M, C);
  }
  f.write_back();
}

}  // namespace kiln
