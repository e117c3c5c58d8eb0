// tanh (ops.h): forward with libm's tanhf, backward from the forward's output, 1 - out^2.
#include <cmath>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

void CpuBackend::tanh_forward(const TanhForward& args) {
  const int64_t count = checks::tanh_forward(args, Device::CPU);
  Fp32Scope f(scratch_);
  const float* in = f.input(args.in).as<float>();
  float* out = f.output(args.out).as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = std::tanh(in[i]);
  f.write_back();
}

void CpuBackend::tanh_backward(const TanhBackward& args) {
  const int64_t count = checks::tanh_backward(args, Device::CPU);
  Fp32Scope f(scratch_);
  const float* out = f.input(args.out).as<float>();
  const float* dout = f.input(args.dout).as<float>();
  float* din = f.output(args.din).as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) din[i] = dout[i] * (1.0f - out[i] * out[i]);
  f.write_back();
}

}  // namespace kiln
