// GatherRows (ops.h): one position of each sequence, copied as stored (no arithmetic, so no fp32
// round trip); the backward scatters dout into that row, Write as Add into zeros.
#include <cstring>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

void CpuBackend::gather_rows(const GatherRows& args) {
  const auto [B, T, C] = checks::gather_rows(args, Device::CPU);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(args.in.dtype);
  const auto* in = static_cast<const char*>(args.in.data);
  auto* out = static_cast<char*>(args.out.data);
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(out + b * row_bytes, in + (b * T + args.position) * row_bytes, row_bytes);
}

void CpuBackend::gather_rows_backward(const GatherRowsBackward& args) {
  const auto [B, T, C] = checks::gather_rows_backward(args, Device::CPU);
  zero_to_write(args.store, {args.din});
  Fp32Scope f(scratch_);
  float* din = f.accumulated(args.din).as<float>();
  const float* dout = f.input(args.dout).as<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) din[(b * T + args.position) * C + c] += dout[b * C + c];
  f.write_back();
}

}  // namespace kiln
