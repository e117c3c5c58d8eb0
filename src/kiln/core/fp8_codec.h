// The two 8-bit floating point formats of the OCP 8-bit floating point specification (2023), as
// NVIDIA's tensor cores read them (CUDA_R_8F_E4M3, CUDA_R_8F_E5M2):
//   E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111 is NaN; largest
//         finite 448, smallest normal 2^-6, subnormals m * 2^-9.
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-style infinities and NaNs (exponent
//         field 31); largest finite 57344, smallest normal 2^-14, subnormals m * 2^-16.
// Encoding rounds to nearest, ties to even, and saturates: values beyond the largest finite,
// infinities included, become +-largest finite (CUDA's __NV_SATFINITE); NaN becomes the format's
// NaN 0x7f with its sign. Header-only and usable on both sides: the CPU reference, the CPU
// emulator of CUDA and the CUDA kernels (where a GPU with fp8 conversion instructions may use them
// instead: they compute the same function).
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/core/host_device.h"

namespace kiln::fp8 {

enum class Format : uint8_t { E4M3, E5M2 };

KILN_HOST_DEVICE constexpr int mantissa_bits(Format format) {
  return format == Format::E4M3 ? 3 : 2;
}
KILN_HOST_DEVICE constexpr int min_normal_exponent(Format format) {
  return format == Format::E4M3 ? -6 : -14;
}
KILN_HOST_DEVICE constexpr float largest(Format format) {
  return format == Format::E4M3 ? 448.0f : 57344.0f;
}
KILN_HOST_DEVICE constexpr uint8_t largest_code(Format format) {
  return format == Format::E4M3 ? 0x7e : 0x7b;
}

KILN_HOST_DEVICE inline uint8_t encode(float value, Format format) {
  const int m = mantissa_bits(format), min_exponent = min_normal_exponent(format);
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = fabsf(value);
  if (magnitude != magnitude) return sign | 0x7f;                        // NaN
  if (magnitude >= largest(format)) return sign | largest_code(format);  // saturate
  // magnitude = q * 2^(e - m) with q in [2^m, 2^(m+1)) for a normal result, or q * 2^(min - m)
  // with q in [0, 2^m) for a subnormal one. Scaling by a power of two is exact in fp32, so rounding
  // q to an integer (nearbyint: ties to even in the default rounding mode) rounds the value.
  int exponent = 0;
  frexpf(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent) unless 0
  const int e = magnitude < ldexpf(1.0f, min_exponent) ? min_exponent : exponent - 1;
  auto q = static_cast<int>(nearbyintf(ldexpf(magnitude, m - e)));
  if (e == min_exponent && q < (1 << m)) return sign | static_cast<uint8_t>(q);  // subnormal or 0
  int biased = e - min_exponent + 1;
  if (q == 2 << m) {  // rounded up into the next binade (never past the largest finite)
    q = 1 << m;
    ++biased;
  }
  return sign | static_cast<uint8_t>((biased << m) | (q - (1 << m)));
}

KILN_HOST_DEVICE inline float decode(uint8_t bits, Format format) {
  const int m = mantissa_bits(format), min_exponent = min_normal_exponent(format);
  const int exponent = (bits & 0x7f) >> m, mantissa = bits & ((1 << m) - 1);
  float magnitude;
  if (format == Format::E4M3 && exponent == 0xf && mantissa == 0x7)
    magnitude = NAN;
  else if (format == Format::E5M2 && exponent == 0x1f)
    magnitude = mantissa ? NAN : INFINITY;
  else if (exponent == 0)
    magnitude = ldexpf(static_cast<float>(mantissa), min_exponent - m);
  else
    magnitude = ldexpf(static_cast<float>((1 << m) + mantissa), exponent + min_exponent - 1 - m);
  return (bits & 0x80) ? -magnitude : magnitude;
}

}  // namespace kiln::fp8
