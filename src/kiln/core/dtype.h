// Element types and their conversions.
//
// fp32 <-> bf16 and fp32 <-> fp16 conversions round to nearest, ties to even (IEEE 754 default),
// handle subnormals exactly, map overflow to +-inf, and keep NaN a NaN (quiet, sign preserved).
// Storage types are plain 16-bit integers so host code never depends on compiler half support.
//
// fp8 E4M3 (the OCP 8-bit floating point specification's E4M3, NVIDIA's __nv_fp8_e4m3 and
// CUDA_R_8F_E4M3): sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; S.1111.111 is
// NaN, the largest finite value 448 (S.1111.110), the smallest normal 2^-6, subnormals m * 2^-9.
// fp32 -> fp8 rounds to nearest, ties to even, and saturates: anything beyond +-448, infinities
// included, becomes +-448 (CUDA's __NV_SATFINITE conversion); NaN stays NaN (sign preserved).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { F32, BF16, F16, I32, U16, F8E4M3 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "fp32", "bf16", "fp16", "int32", "uint16", "fp8_e4m3"

uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float fp16_to_float(uint16_t bits);
uint8_t float_to_fp8_e4m3(float value);
float fp8_e4m3_to_float(uint8_t bits);

// Whole buffers between fp32 and a floating dtype (fp32, bf16, fp16 or fp8 E4M3); fp32 is a plain
// copy.
// Throws for other dtypes.
void widen_to_fp32(const void* in, DType dtype, float* out, int64_t count);
void narrow_from_fp32(const float* in, DType dtype, void* out, int64_t count);

}  // namespace kiln
