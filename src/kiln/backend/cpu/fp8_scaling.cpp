// fp8 delayed scaling (ops.h, Fp8UpdateScales): the next scale of every fp8 tensor from its amax
// history, one row of the state at a time.
#include <algorithm>
#include <cmath>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

void CpuBackend::fp8_update_scales(const Fp8UpdateScales& args) {
  const int64_t history = checks::fp8_update_scales(args, Device::CPU);
  const int64_t columns = kFp8StateColumns + history;
  for (int64_t row = 0; row < args.state.shape[0]; ++row) {
    float* r = args.state.as<float>() + row * columns;
    float& scale = r[0];
    float& scale_inv = r[1];
    float& amax = r[2];
    const float fp8_max = r[3];
    float* past = r + kFp8StateColumns;
    past[args.position] = amax;
    const float seen = args.use_history_max ? *std::max_element(past, past + history) : amax;
    if (std::isfinite(seen) && seen > 0.0f) {
      scale = std::ldexp(fp8_max / seen, -args.margin);
      scale_inv = 1.0f / scale;
    }
    amax = 0.0f;
  }
}

}  // namespace kiln
