// What lets the CPU back-end's elementwise loops run in the vector units of the machine that runs
// them, though kiln is built for baseline x86-64 (SSE2) so that one binary runs anywhere.
//
// KILN_VECTOR_CLONES on a function compiles it three times, for AVX-512, for AVX2 with FMA and for
// baseline x86-64; the dynamic loader binds the best one the CPU has (GCC's target_clones, through
// an ifunc). Contract for such a function:
//   - no OpenMP parallel region inside: GCC outlines a region's body into a function of its own
//     that the clones do not cover. The parallel loop stays outside (for_each_thread_range) and
//     calls a cloned function on its thread's contiguous range. `#pragma omp simd` is fine;
//   - no call to libm inside the loop (GCC vectorizes no such call without -ffast-math): take
//     exp_vectorizable() below. std::sqrt is fine: the back-end's files are compiled with
//     -fno-math-errno (CMakeLists.txt), so it is one instruction.
// The back-end's files are also compiled with -ffp-contract=off, so an elementwise loop gives the
// same bits in every clone: on any machine, for any thread count. A sum under `omp simd` is
// ordered by the clone's vector width, so it may differ between machines in the last bits.
#pragma once

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

// arch=x86-64-vN names need GCC 12; elsewhere the functions are compiled once, for the build's target.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define KILN_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KILN_VECTOR_CLONES
#endif

namespace kiln {

// e^x with the operations a vector unit has, branch-free. Cody and Waite's reduction
// x = n ln2 + r, |r| <= ln2 / 2, n rounded by adding 1.5 * 2^23; e^r by its Taylor series to r^7
// (truncation below 1e-8 relative); 2^n written into the exponent bits. Measured against glibc's
// expf over [-87.33, 88], in every clone: at most 2 ulp apart (tests/backend/vector_math_test.cpp).
// Domain: 0 below ln(FLT_MIN) = -87.34 (glibc gives subnormals there), +inf above 88 (glibc
// overflows at 88.72), NaN gives NaN. kiln's callers take only x <= 0 (softmax and cross-entropy,
// GELU's tanh).
inline float exp_vectorizable(float x) {
  constexpr float kLowest = -87.336544f, kHighest = 88.0f;
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;  // ln 2 = high + low, high exact in 9 bits
  constexpr float kRounder = 12582912.0f;                               // 1.5 * 2^23
  const float above = x < kLowest ? kLowest : x;
  const float clamped = above > kHighest ? kHighest : above;
  const float shifted = clamped * kLog2e + kRounder;  // n in the low mantissa bits
  const float n = shifted - kRounder;
  const float r = (clamped - n * kLn2High) - n * kLn2Low;
  float series = 1.0f / 5040.0f;
  series = series * r + 1.0f / 720.0f;
  series = series * r + 1.0f / 120.0f;
  series = series * r + 1.0f / 24.0f;
  series = series * r + 1.0f / 6.0f;
  series = series * r + 0.5f;
  series = series * r + 1.0f;
  series = series * r + 1.0f;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRounder);
  const float power_of_two = std::bit_cast<float>(static_cast<uint32_t>(exponent + 127) << 23);
  const float value = series * power_of_two;
  const float floored = x < kLowest ? 0.0f : value;
  return x > kHighest ? std::numeric_limits<float>::infinity() : floored;
}

// values[i] = e^(values[i] - shift) for i < count, in the vector units.
void exp_shifted_in_place(float* values, int64_t count, float shift);

// Splits [0, count) among the threads of an OpenMP team, in thread order, in pieces of whole
// 16-float vectors (the last piece takes the tail), and calls range(begin, end) on each thread
// whose piece is not empty.
template <class RangeFunction>
void for_each_thread_range(int64_t count, RangeFunction&& range) {
#pragma omp parallel
  {
    constexpr int64_t kVector = 16;
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t vectors = (count + kVector - 1) / kVector;
    const int64_t per_thread = (vectors + threads - 1) / threads * kVector;
    const int64_t begin = std::min(count, thread * per_thread);
    const int64_t end = std::min(count, begin + per_thread);
    if (begin < end) range(begin, end);
  }
}

}  // namespace kiln
