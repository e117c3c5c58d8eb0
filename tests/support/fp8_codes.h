// Helpers of the tests of fp8 products and of the ops that cast for one (ops.h: the LayerNorm, GELU
// and attention ops with fp8): scales, poisoned codes, and what a cast of stored values must decode
// to.
#pragma once

#include <vector>

#include "kiln/core/fp8_codec.h"
#include "support/device_tensors.h"

namespace kiln::testing {

// An fp8 operand's scale, 1 / scale and amax (max-accumulated from amax_before), on the test's device.
inline Fp8Operand fp8_operand(DeviceTensors& t, float scale, float amax_before) {
  return {t.floats({scale}, {1}), t.floats({1.0f / scale}, {1}), t.floats({amax_before}, {1})};
}

// A product's casts at fixed scales: inputs 4, weight 16, output gradient 8 (amax from 0).
inline Fp8Matmul fixed_fp8_casts(DeviceTensors& t) {
  return {fp8_operand(t, 4.0f, 0.0f), fp8_operand(t, 16.0f, 0.0f), fp8_operand(t, 8.0f, 0.0f)};
}

// Codes, every byte a NaN code (0x7F in E4M3 and E5M2) until written.
inline Tensor poisoned_codes(DeviceTensors& t, Shape shape, DType format = DType::F8E4M3) {
  return t.upload(std::vector<uint8_t>(static_cast<size_t>(shape.numel()), 0x7F), shape, format);
}

// The reference meaning of a cast (ops.h): dec(fp8(x * scale)) of each stored element, in `format`.
inline std::vector<float> decoded_cast(const std::vector<float>& values, float scale, DType format) {
  const fp8::Format f = format == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2;
  std::vector<float> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = fp8::decode(fp8::encode(values[i] * scale, f), f);
  return codes;
}

}  // namespace kiln::testing
