// Residual add and fill.
#include "kiln/backend/checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

void CpuBackend::residual_forward(const ResidualForward& args) {
  constexpr const char* op = "residual_forward";
  checks::require(args.out, DType::F32, Device::CPU, op, "out");
  checks::require(args.a, DType::F32, Device::CPU, op, "a");
  checks::require(args.b, DType::F32, Device::CPU, op, "b");
  const int64_t count = args.out.numel();
  checks::require_numel(args.a, count, op, "a");
  checks::require_numel(args.b, count, op, "b");
  const float* a = args.a.as<float>();
  const float* b = args.b.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::fill(const Fill& args) {
  checks::require(args.out, DType::F32, Device::CPU, "fill", "out");
  float* out = args.out.as<float>();
  const int64_t count = args.out.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = args.value;
}

}  // namespace kiln
