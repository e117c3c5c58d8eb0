// Residual add and fill.
#include "kiln/backend/cpu/checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

void CpuBackend::residual_forward(const ResidualForward& args) {
  constexpr const char* op = "residual_forward";
  cpu::require(args.out, DType::F32, op, "out");
  cpu::require(args.a, DType::F32, op, "a");
  cpu::require(args.b, DType::F32, op, "b");
  const int64_t count = args.out.numel();
  cpu::require_numel(args.a, count, op, "a");
  cpu::require_numel(args.b, count, op, "b");
  const float* a = args.a.as<float>();
  const float* b = args.b.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::fill(const Fill& args) {
  cpu::require(args.out, DType::F32, "fill", "out");
  float* out = args.out.as<float>();
  const int64_t count = args.out.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = args.value;
}

}  // namespace kiln
