// LayerNorm (Ba et al. 2016) over the channel axis. Forward keeps mean and 1/std per row so the
// backward needs no second pass over statistics. Parameter gradients are column-parallel sums in
// row order, so they are identical for any thread count.
#include <algorithm>
#include <cmath>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/column_sums.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"

namespace kiln {

namespace {
void layernorm_forward_fp32(const LayerNormForward& args) {
  const auto [M, C] = checks::layernorm_forward(args, Device::CPU);
  const float* in = args.in.as<float>();
  const float* weight = args.weight.as<float>();
  const float* bias = args.bias.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float* row = in + m * C;
    float sum = 0.0f;
    for (int64_t c = 0; c < C; ++c) sum += row[c];
    const float mean = sum / static_cast<float>(C);
    float squares = 0.0f;
    for (int64_t c = 0; c < C; ++c) squares += (row[c] - mean) * (row[c] - mean);
    const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(C) + args.eps);
    float* out_row = out + m * C;
    for (int64_t c = 0; c < C; ++c) out_row[c] = (row[c] - mean) * rstd * weight[c] + bias[c];
    args.mean.as<float>()[m] = mean;
    args.rstd.as<float>()[m] = rstd;
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
void layernorm_backward_fp32(const LayerNormBackward& args) {
  const auto [M, C] = checks::layernorm_backward(args, Device::CPU);
  const float* in = args.in.as<float>();
  const float* dout = args.dout.as<float>();
  const float* weight = args.weight.as<float>();
  const float* means = args.mean.as<float>();
  const float* rstds = args.rstd.as<float>();
  float* din = args.din.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float* row = in + m * C;
    const float* grad = dout + m * C;
    const float mean = means[m], rstd = rstds[m];
    // din = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight.
    float grad_mean = 0.0f, grad_dot_xhat = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      const float g = grad[c] * weight[c];
      grad_mean += g;
      grad_dot_xhat += g * (row[c] - mean) * rstd;
    }
    grad_mean /= static_cast<float>(C);
    grad_dot_xhat /= static_cast<float>(C);
    float* din_row = din + m * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (row[c] - mean) * rstd;
      din_row[c] += rstd * (grad[c] * weight[c] - grad_mean - xhat * grad_dot_xhat);
    }
  }
  float* dweight = args.dweight.as<float>();
  float* dbias = args.dbias.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    float weight_sum = 0.0f, bias_sum = 0.0f;
    for (int64_t m = 0; m < M; ++m) {
      const float g = dout[m * C + c];
      weight_sum += g * (in[m * C + c] - means[m]) * rstds[m];
      bias_sum += g;
    }
    dweight[c] += weight_sum;
    dbias[c] += bias_sum;
  }
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
