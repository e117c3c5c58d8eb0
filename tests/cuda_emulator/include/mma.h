// Stands in for CUDA's mma.h (nvcuda::wmma) in the CPU emulator (cuda_emulator.h): the 16 x 16 x 16
// fragments kiln's tensor-core kernels use, with 16-bit inputs and fp32 accumulators.
//
// WMMA leaves the mapping from a lane's fragment elements to matrix positions unspecified. Here
// each fragment use (matrix_a, matrix_b, accumulator) has its own scrambled mapping (an affine
// permutation of the 256 positions), so a kernel that assumes any layout, or that a and accumulator
// fragments share one, gives wrong answers under the emulator. Every call is warp-wide: each one
// waits for all 32 lanes (a diverged warp is caught), loads and stores check the alignment rules
// (pointer 256-bit aligned, leading dimension a multiple of 16 bytes), and mma_sync reads the
// other lanes' elements before any lane writes its result, so d may alias c.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_emulator.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

constexpr int kSide = 16, kPerLane = kSide * kSide / 32;

// Element e of lane l holds position (multiplier * (8 l + e) + offset) mod 256, row-major in the
// 16 x 16 block; odd multipliers make each map a permutation.
template <typename Use>
struct Scramble;
template <>
struct Scramble<matrix_a> {
  static constexpr int multiplier = 101, offset = 3;
};
template <>
struct Scramble<matrix_b> {
  static constexpr int multiplier = 77, offset = 200;
};
template <>
struct Scramble<accumulator> {
  static constexpr int multiplier = 37, offset = 11;
};

template <typename Use>
constexpr int position(int lane, int element) {
  return (Scramble<Use>::multiplier * (lane * kPerLane + element) + Scramble<Use>::offset) & 255;
}

// (lane, element) holding `position`, as lane * kPerLane + element.
template <typename Use>
struct Owners {
  int of[256] = {};
  constexpr Owners() {
    for (int slot = 0; slot < 256; ++slot)
      of[position<Use>(slot / kPerLane, slot % kPerLane)] = slot;
  }
};
template <typename Use>
inline constexpr Owners<Use> owners{};

inline float widen(float value) { return value; }
inline float widen(__nv_bfloat16 value) { return __bfloat162float(value); }
inline float widen(__half value) { return __half2float(value); }

inline void check_layout(const void* pointer, unsigned ldm, size_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(pointer) % 32 != 0)
    cuda_emulator::fail("a WMMA load or store pointer is not 256-bit aligned");
  if (ldm * element_bytes % 16 != 0)
    cuda_emulator::fail("a WMMA leading dimension of " + std::to_string(ldm) +
                        " elements is not a multiple of 16 bytes");
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has the m16n16k16 shape only");
  using element_type = T;
  static constexpr int num_elements = detail::kPerLane;
  T x[detail::kPerLane];
};

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
  cuda_emulator::sync_warp(0xffffffffu);
  for (T& element : f.x) element = static_cast<T>(value);
}

// matrix_a and matrix_b: the layout is the fragment's; logical position (r, c) is at r * ldm + c
// row-major, c * ldm + r column-major.
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* pointer, unsigned ldm) {
  detail::check_layout(pointer, ldm, sizeof(T));
  cuda_emulator::sync_warp(0xffffffffu);
  const int lane = cuda_emulator::lane();
  for (int e = 0; e < detail::kPerLane; ++e) {
    const int position = detail::position<Use>(lane, e), r = position / 16, c = position % 16;
    f.x[e] = std::is_same_v<Layout, row_major> ? pointer[r * ldm + c] : pointer[c * ldm + r];
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* pointer,
                             unsigned ldm, layout_t layout) {
  detail::check_layout(pointer, ldm, sizeof(float));
  cuda_emulator::sync_warp(0xffffffffu);
  const int lane = cuda_emulator::lane();
  for (int e = 0; e < detail::kPerLane; ++e) {
    const int position = detail::position<accumulator>(lane, e), r = position / 16,
              c = position % 16;
    f.x[e] = layout == mem_row_major ? pointer[r * ldm + c] : pointer[c * ldm + r];
  }
}

inline void store_matrix_sync(float* pointer, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check_layout(pointer, ldm, sizeof(float));
  cuda_emulator::sync_warp(0xffffffffu);
  const int lane = cuda_emulator::lane();
  for (int e = 0; e < detail::kPerLane; ++e) {
    const int position = detail::position<accumulator>(lane, e), r = position / 16,
              c = position % 16;
    (layout == mem_row_major ? pointer[r * ldm + c] : pointer[c * ldm + r]) = f.x[e];
  }
}

// d = a b + c over the warp, in fp32 (the 16-bit products are exact in fp32).
template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  struct Operands {
    const fragment<matrix_a, 16, 16, 16, T, LayoutA>* a;
    const fragment<matrix_b, 16, 16, 16, T, LayoutB>* b;
    const fragment<accumulator, 16, 16, 16, float>* c;
  };
  const Operands mine{&a, &b, &c};
  const void* const* lanes = cuda_emulator::gather(&mine);
  const auto element = [&](const auto& owners, int position, auto member) {
    const int slot = owners.of[position];
    return detail::widen((static_cast<const Operands*>(lanes[slot / detail::kPerLane])->*member)
                             ->x[slot % detail::kPerLane]);
  };
  const int lane = cuda_emulator::lane();
  float result[detail::kPerLane];
  for (int e = 0; e < detail::kPerLane; ++e) {
    const int position = detail::position<accumulator>(lane, e), r = position / 16,
              col = position % 16;
    float sum = element(detail::owners<accumulator>, position, &Operands::c);
    for (int k = 0; k < 16; ++k)
      sum += element(detail::owners<matrix_a>, r * 16 + k, &Operands::a) *
             element(detail::owners<matrix_b>, k * 16 + col, &Operands::b);
    result[e] = sum;
  }
  cuda_emulator::sync_warp(0xffffffffu);  // every lane has read a, b and c
  for (int e = 0; e < detail::kPerLane; ++e) d.x[e] = result[e];
}

}  // namespace nvcuda::wmma
