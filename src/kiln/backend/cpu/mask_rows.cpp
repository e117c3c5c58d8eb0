// MaskRows (ops.h): kept rows copied as stored (no arithmetic, so no fp32 round trip), dropped rows
// zeroed; bytes of zero are +0 in every floating dtype.
#include <cstring>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

void CpuBackend::mask_rows(const MaskRows& args) {
  const auto [M, C] = checks::mask_rows(args, Device::CPU);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(args.in.dtype);
  const int32_t* keep = args.keep.as<int32_t>();
  const auto* in = static_cast<const char*>(args.in.data);
  auto* out = static_cast<char*>(args.out.data);
  for (int64_t m = 0; m < M; ++m) {
    char* row = out + m * row_bytes;
    if (keep[m] == 0)
      std::memset(row, 0, row_bytes);
    else if (row != in + m * row_bytes)
      std::memcpy(row, in + m * row_bytes, row_bytes);
  }
}

}  // namespace kiln
