#include "kiln/backend/cpu/fp8_cast.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/fp8_codec.h"

namespace kiln {

void cast_output_to_fp8(const Tensor& values, DType dtype, const Fp8Operand& operand, DType format,
                        const Tensor& codes, const Tensor& codes_t, ConversionScratch& scratch) {
  const fp8::Format f = format == DType::F8E5M2 ? fp8::Format::E5M2 : fp8::Format::E4M3;
  const int64_t M = values.shape[0], C = values.shape[1];
  float* y = values.as<float>();
  void* rounded = scratch.take(static_cast<size_t>(M * C));  // 4 bytes an element: room for 2
  narrow_from_fp32(y, dtype, rounded, M * C);
  widen_to_fp32(rounded, dtype, y, M * C);
  const float scale = *operand.scale.as<float>();
  float amax = *operand.amax.as<float>();
  uint8_t* rows = codes.as<uint8_t>();
  uint8_t* columns = codes_t.as<uint8_t>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const float value = y[m * C + c];
      amax = std::max(amax, std::fabs(value));
      const uint8_t code = fp8::encode(value * scale, f);
      if (rows) rows[m * C + c] = code;
      if (columns) columns[c * M + m] = code;
    }
  *operand.amax.as<float>() = amax;
}

}  // namespace kiln
