// Inputs for the matrix-instruction tests (warp_matrix_test.cpp, warpgroup_matrix_test.cpp): small
// integers and halves, exact in bf16, fp16 and in fp32 sums of 16 products, and their 16-bit codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln::testing {

inline float matrix_a_value(size_t i) { return static_cast<float>((i * 37 + 11) % 23) * 0.5f - 5.5f; }
inline float matrix_b_value(size_t i) { return static_cast<float>((i * 53 + 5) % 19) - 9.0f; }

// The 16-bit code of `value` in T (__nv_bfloat16 or __half).
template <typename T>
uint16_t bits_of(float value) {
  const T narrow = static_cast<T>(value);
  uint16_t bits;
  std::memcpy(&bits, &narrow, sizeof(bits));
  return bits;
}

}  // namespace kiln::testing
