// AdamW over flat fp32 buffers, segment by segment, and the deterministic sum of squares used for
// the global gradient norm (fixed 64K-element chunks summed in order, whatever the thread count).
#include <cmath>
#include <vector>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

void CpuBackend::adamw_step(const AdamwStep& args) {
  checks::adamw_step(args, Device::CPU);
  const float bias_correction1 = 1.0f - std::pow(args.beta1, static_cast<float>(args.step));
  const float bias_correction2 = 1.0f - std::pow(args.beta2, static_cast<float>(args.step));
  float* master = args.master.as<float>();
  const float* grad = args.grad.as<float>();
  float* m = args.exp_avg.as<float>();
  float* v = args.exp_avg_sq.as<float>();
  const DType out_dtype = args.param_out.dtype;
  for (const AdamwSegment& segment : args.segments) {
    const int64_t end = segment.offset + segment.count;
#pragma omp parallel for schedule(static)
    for (int64_t i = segment.offset; i < end; ++i) {
      const float g = grad[i] * args.grad_scale;
      m[i] = args.beta1 * m[i] + (1.0f - args.beta1) * g;
      v[i] = args.beta2 * v[i] + (1.0f - args.beta2) * g * g;
      const float m_hat = m[i] / bias_correction1;
      const float v_hat = v[i] / bias_correction2;
      master[i] -= args.lr * (m_hat / (std::sqrt(v_hat) + args.eps) + segment.weight_decay * master[i]);
      switch (out_dtype) {
        case DType::F32: args.param_out.as<float>()[i] = master[i]; break;
        case DType::BF16: args.param_out.as<uint16_t>()[i] = float_to_bf16(master[i]); break;
        case DType::F16: args.param_out.as<uint16_t>()[i] = float_to_fp16(master[i]); break;
        default: break;  // rejected by checks::adamw_step
      }
    }
  }
}

double CpuBackend::sum_of_squares(const SumOfSquares& args) {
  const int64_t count = checks::sum_of_squares(args, Device::CPU);
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  const float* in = args.in.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    double sum = 0.0;
    const int64_t end = std::min(count, (chunk + 1) * kChunk);
    for (int64_t i = chunk * kChunk; i < end; ++i) sum += static_cast<double>(in[i]) * in[i];
    partial[static_cast<size_t>(chunk)] = sum;
  }
  double total = 0.0;
  for (double value : partial) total += value;
  return total;
}

}  // namespace kiln
