#include "kiln/core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/fp8_codec.h"

namespace kiln {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
  }
  fail("unknown dtype {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::U16: return "uint16";
    case DType::F8E4M3: return "fp8_e4m3";
    case DType::F8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and the top payload bits, force the quiet bit so truncation cannot make inf.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Overflow carries
  // into the exponent and produces inf, which is the correctly rounded result.
  uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_fp16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;            // NaN -> quiet NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;           // >= 65520 rounds to inf
  if (abs_bits < 0x38800000u) {                                 // below fp16's smallest normal
    // Subnormal (or zero) result: value = m * 2^-24 with m in [0, 1024]. Scale the fp32 value
    // into that fixed point and round to nearest even on the integer.
    if (abs_bits < 0x33000000u) return sign;                    // < 2^-25 rounds to zero
    const uint32_t exponent = abs_bits >> 23;                    // biased, 102..112
    const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;  // implicit one
    const uint32_t shift = 126u - exponent;                      // 14..24: bits dropped
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) result += 1u;
    return sign | static_cast<uint16_t>(result);
  }
  // Normal result: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
  uint32_t rebased = abs_bits - (112u << 23);
  const uint32_t lsb = (rebased >> 13) & 1u;
  rebased += 0xfffu + lsb;
  return sign | static_cast<uint16_t>(rebased >> 13);
}

float fp16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // Zero or subnormal: exactly mantissa * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint8_t float_to_fp8_e4m3(float value) { return fp8::encode(value, fp8::Format::E4M3); }
float fp8_e4m3_to_float(uint8_t bits) { return fp8::decode(bits, fp8::Format::E4M3); }
uint8_t float_to_fp8_e5m2(float value) { return fp8::encode(value, fp8::Format::E5M2); }
float fp8_e5m2_to_float(uint8_t bits) { return fp8::decode(bits, fp8::Format::E5M2); }

void widen_to_fp32(const void* in, DType dtype, float* out, int64_t count) {
  const auto* bits = static_cast<const uint16_t*>(in);
  switch (dtype) {
    case DType::F32:
      if (count > 0) std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(bits[i]);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) out[i] = fp16_to_float(bits[i]);
      return;
    case DType::F8E4M3:
    case DType::F8E5M2: {
      const fp8::Format format = dtype == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2;
      for (int64_t i = 0; i < count; ++i) out[i] = fp8::decode(static_cast<const uint8_t*>(in)[i], format);
      return;
    }
    default: fail("cannot widen {} values to fp32: not a floating dtype", dtype_name(dtype));
  }
}

void narrow_from_fp32(const float* in, DType dtype, void* out, int64_t count) {
  auto* bits = static_cast<uint16_t*>(out);
  switch (dtype) {
    case DType::F32:
      if (count > 0) std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) bits[i] = float_to_bf16(in[i]);
      return;
    case DType::F16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) bits[i] = float_to_fp16(in[i]);
      return;
    case DType::F8E4M3:
    case DType::F8E5M2: {
      const fp8::Format format = dtype == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2;
      for (int64_t i = 0; i < count; ++i) static_cast<uint8_t*>(out)[i] = fp8::encode(in[i], format);
      return;
    }
    default: fail("cannot round fp32 values to {}: not a floating dtype", dtype_name(dtype));
  }
}

}  // namespace kiln
