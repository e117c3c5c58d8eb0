// Residual add and fill.
#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

void CpuBackend::residual_forward(const ResidualForward& args) {
  const int64_t count = checks::residual_forward(args, Device::CPU);
  const float* a = args.a.as<float>();
  const float* b = args.b.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::fill(const Fill& args) {
  const int64_t count = checks::fill(args, Device::CPU);
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = args.value;
}

}  // namespace kiln
