// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016).
#include <cmath>
#include <numbers>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"
#include "kiln/backend/cpu/vector_math.h"

namespace kiln {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCubic = 0.044715f;

// tanh through one exponential: tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|). With
// exp_vectorizable its error (~2e-7) is what GELU's 0.5 x (1 + tanh) feels, and that stays at
// fp32 rounding; the loops below run in the vector units (vector_math.h).
inline float tanh_vectorizable(float u) {
  const float e = exp_vectorizable(-2.0f * std::fabs(u));
  return std::copysign((1.0f - e) / (1.0f + e), u);
}

KILN_VECTOR_CLONES void gelu_range(const float* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = in[i];
    out[i] = 0.5f * x * (1.0f + tanh_vectorizable(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

void gelu_fp32(const float* in, float* out, int64_t count) {
  for_each_thread_range(count, [&](int64_t begin, int64_t end) { gelu_range(in + begin, out + begin, end - begin); });
}

void gelu_forward_fp32(const GeluForward& args) {
  const int64_t count = checks::gelu_forward(args, Device::CPU);
  gelu_fp32(args.in.as<float>(), args.out.as<float>(), count);
}
}  // namespace

void CpuBackend::gelu_forward(const GeluForward& args) {
  const int64_t count = checks::gelu_forward(args, Device::CPU);
  if (args.fp8) {  // only cast (ops.h): the GELU op's value, rounded as it would store it, then the codes
    scratch_.reset();
    const int64_t N = args.in.shape[args.in.shape.rank - 1];
    const Tensor values{scratch_.take(static_cast<size_t>(count)), {count / N, N}, DType::F32, Device::CPU};
    widen_to_fp32(args.in.data, args.in.dtype, values.as<float>(), count);
    gelu_fp32(values.as<float>(), values.as<float>(), count);
    cast_output_to_fp8(values, args.in.dtype, *args.fp8, DType::F8E4M3, args.out, args.out_fp8_t, scratch_);
    return;
  }
  Fp32Scope f(scratch_);
  gelu_forward_fp32({f.output(args.out), f.input(args.in)});
  f.write_back();
}

namespace {
KILN_VECTOR_CLONES void gelu_backward_range(const float* in, const float* dout, float* din, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = in[i];
    const float tanh_inner = tanh_vectorizable(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float sech_squared = 1.0f - tanh_inner * tanh_inner;
    const float local = 0.5f * (1.0f + tanh_inner) +
                        0.5f * x * sech_squared * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] = local * dout[i];
  }
}

void gelu_backward_fp32(const GeluBackward& args) {
  const int64_t count = checks::gelu_backward(args, Device::CPU);
  const float* in = args.in.as<float>();
  const float* dout = args.dout.as<float>();
  float* din = args.din.as<float>();
  for_each_thread_range(count, [&](int64_t begin, int64_t end) {
    gelu_backward_range(in + begin, dout + begin, din + begin, end - begin);
  });
}
}  // namespace

void CpuBackend::gelu_backward(const GeluBackward& args) {
  checks::gelu_backward(args, Device::CPU);
  Fp32Scope f(scratch_);
  gelu_backward_fp32({f.output(args.din), f.input(args.in), f.input(args.dout)});
  f.write_back();
}

}  // namespace kiln
