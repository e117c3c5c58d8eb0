#include "kiln/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace kiln {
namespace {

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001)), 0x3f81);
}

TEST(Bf16, EdgeValues) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not truncate to inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001)))));
  // The largest finite float rounds to inf in bf16.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // Subnormals keep their top bits.
  EXPECT_EQ(float_to_bf16(from_bits(0x00010000)), 0x0001);
  EXPECT_EQ(bf16_to_float(0x0001), from_bits(0x00010000));
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(Fp16, ExactValuesRoundTrip) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float value = fp16_to_float(half);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(value))));
    } else {
      EXPECT_EQ(float_to_fp16(value), half) << "bits " << bits;
    }
  }
}

TEST(Fp16, RoundsToNearestEvenAndOverflows) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);      // largest finite
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);      // below the halfway point to 65536
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);      // halfway: ties to even = inf
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e10f), 0xfc00);
  // 1 + 2^-11 is halfway between 1 and the next fp16 (1 + 2^-10): ties to even, 1.0.
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Fp16, Subnormals) {
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);   // halfway to zero: ties to even
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);   // above halfway
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);   // 1.5 ulp: ties to even (2)
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff); // largest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400); // rounds up into the normals
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(Fp16, NanAndInfinity) {
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(fp16_to_float(0xfc00)));
}

}  // namespace
}  // namespace kiln
