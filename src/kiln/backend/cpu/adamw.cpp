// AdamW over flat fp32 buffers, segment by segment, and the deterministic sum of squares used for
// the global gradient norm (fixed 64K-element chunks summed in order, whatever the thread count).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/vector_math.h"

namespace kiln {

namespace {
struct AdamwConstants {
  float lr, beta1, beta2, eps, grad_scale, bias_correction1, bias_correction2, weight_decay;
};

// AdamW (Loshchilov & Hutter) over count elements of the master weights and moments.
KILN_VECTOR_CLONES void adamw_range(float* master, const float* grad, float* m, float* v, int64_t count,
                                    AdamwConstants c) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad[i] * c.grad_scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const float m_hat = m[i] / c.bias_correction1;
    const float v_hat = v[i] / c.bias_correction2;
    master[i] -= c.lr * (m_hat / (std::sqrt(v_hat) + c.eps) + c.weight_decay * master[i]);
  }
}

// The parameters the model reads: the updated master weights, rounded to their dtype.
void write_parameters(const Tensor& param_out, const float* master, int64_t begin, int64_t end) {
  switch (param_out.dtype) {
    case DType::F32: {
      float* out = param_out.as<float>();
      if (out != master) std::copy(master + begin, master + end, out + begin);
      break;
    }
    case DType::BF16:
      for (int64_t i = begin; i < end; ++i) param_out.as<uint16_t>()[i] = float_to_bf16(master[i]);
      break;
    case DType::F16:
      for (int64_t i = begin; i < end; ++i) param_out.as<uint16_t>()[i] = float_to_fp16(master[i]);
      break;
    default: break;  // rejected by checks::adamw_step
  }
}
}  // namespace

void CpuBackend::adamw_step(const AdamwStep& args) {
  checks::adamw_step(args, Device::CPU);
  float* master = args.master.as<float>();
  const float* grad = args.grad.as<float>();
  float* m = args.exp_avg.as<float>();
  float* v = args.exp_avg_sq.as<float>();
  for (const AdamwSegment& segment : args.segments) {
    const AdamwConstants constants{args.lr, args.beta1, args.beta2, args.eps, args.grad_scale,
                                   1.0f - std::pow(args.beta1, static_cast<float>(args.step)),
                                   1.0f - std::pow(args.beta2, static_cast<float>(args.step)), segment.weight_decay};
    for_each_thread_range(segment.count, [&](int64_t begin, int64_t end) {
      const int64_t offset = segment.offset + begin, count = end - begin;
      adamw_range(master + offset, grad + offset, m + offset, v + offset, count, constants);
      write_parameters(args.param_out, master, offset, offset + count);
    });
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
