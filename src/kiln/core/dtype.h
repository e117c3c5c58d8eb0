// Element types and their conversions.
//
// fp32 <-> bf16 and fp32 <-> fp16 conversions round to nearest, ties to even (IEEE 754 default),
// handle subnormals exactly, map overflow to +-inf, and keep NaN a NaN (quiet, sign preserved).
// Storage types are plain 16-bit integers so host code never depends on compiler half support.
//
// fp8 E4M3 and E5M2: the OCP 8-bit floating point formats, rounded to nearest even and saturating
// (core/fp8_codec.h says how).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { F32, BF16, F16, I32, U16, F8E4M3, F8E5M2 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "fp32", "bf16", "fp16", "int32", "uint16", "fp8_e4m3", "fp8_e5m2"

uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float fp16_to_float(uint16_t bits);
uint8_t float_to_fp8_e4m3(float value);
float fp8_e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8_e5m2(float value);
float fp8_e5m2_to_float(uint8_t bits);

// Whole buffers between fp32 and a floating dtype (fp32, bf16, fp16 or either fp8); fp32 is a
// plain copy.
// Throws for other dtypes.
void widen_to_fp32(const void* in, DType dtype, float* out, int64_t count);
void narrow_from_fp32(const float* in, DType dtype, void* out, int64_t count);

}  // namespace kiln
