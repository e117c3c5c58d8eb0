#include "kiln/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

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

TEST(Fp8E4M3, KnownCodes) {
  // Values from the OCP 8-bit floating point specification's E4M3 table.
  EXPECT_EQ(float_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(-2.0f), 0xc0);
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7e);                  // largest finite
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -6)), 0x08);    // smallest normal
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(7.0f, -9)), 0x07);    // largest subnormal
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -9)), 0x01);    // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x62), 40.0f);                   // 1.25 * 2^5
  EXPECT_EQ(fp8_e4m3_to_float(0xb4), -0.75f);                  // -1.5 * 2^-1
}

// Every code decodes and encodes back; the midpoint to the next code up ties to the even one and
// anything off it rounds to the nearer.
void expect_every_code_round_trips(uint8_t (*encode)(float), float (*decode)(uint8_t), uint8_t largest_finite) {
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<uint8_t>(code);
    const float value = decode(bits);
    if ((code & 0x7f) > largest_finite) {  // infinity (E5M2) or NaN
      if (std::isnan(value)) EXPECT_EQ(encode(value), (bits & 0x80) | 0x7f) << code;
      else EXPECT_EQ(encode(value), (bits & 0x80) | largest_finite) << code;  // saturates
      continue;
    }
    EXPECT_EQ(encode(value), bits) << code << " = " << value;
    if ((code & 0x7f) < largest_finite) {
      const float next = decode(static_cast<uint8_t>(code + 1));
      EXPECT_GT(std::fabs(next), std::fabs(value)) << code;
      const float midpoint = (value + next) / 2;  // exact in fp32
      const uint8_t even = (code & 1) ? static_cast<uint8_t>(code + 1) : bits;
      EXPECT_EQ(encode(midpoint), even) << code;
      EXPECT_EQ(encode(std::nextafter(midpoint, 2 * next)), code + 1) << code;
      EXPECT_EQ(encode(std::nextafter(midpoint, 0.0f)), bits) << code;
    }
  }
}

TEST(Fp8E4M3, EveryCodeRoundTrips) { expect_every_code_round_trips(float_to_fp8_e4m3, fp8_e4m3_to_float, 0x7e); }
TEST(Fp8E5M2, EveryCodeRoundTrips) { expect_every_code_round_trips(float_to_fp8_e5m2, fp8_e5m2_to_float, 0x7b); }

TEST(Fp8E5M2, KnownCodesAndSaturation) {
  EXPECT_EQ(float_to_fp8_e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_fp8_e5m2(57344.0f), 0x7b);                // largest finite
  EXPECT_EQ(float_to_fp8_e5m2(1e9f), 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(-std::numeric_limits<float>::infinity()), 0xfb);
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(1.0f, -14)), 0x04);   // smallest normal
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(1.0f, -16)), 0x01);   // smallest subnormal
  EXPECT_EQ(fp8_e5m2_to_float(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7e)));
  EXPECT_EQ(fp8_e5m2_to_float(0x47), 7.0f);                    // 1.75 * 2^2
  EXPECT_EQ(dtype_name(DType::F8E5M2), "fp8_e5m2");
}

TEST(Fp8E4M3, SaturatesAndKeepsNan) {
  EXPECT_EQ(float_to_fp8_e4m3(449.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: to even
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -140)), 0x00);  // an fp32 subnormal
  std::vector<float> values = {1.0f, -0.3f, 500.0f};
  std::vector<uint8_t> codes(3);
  narrow_from_fp32(values.data(), DType::F8E4M3, codes.data(), 3);
  widen_to_fp32(codes.data(), DType::F8E4M3, values.data(), 3);
  EXPECT_EQ(values, (std::vector<float>{1.0f, -0.3125f, 448.0f}));
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_EQ(dtype_name(DType::F8E4M3), "fp8_e4m3");
}

}  // namespace
}  // namespace kiln
