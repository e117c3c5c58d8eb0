// Stands in for CUDA's mma.h (nvcuda::wmma) in the CPU emulator (cuda_emulator.h): the 16 x 16 x 16
// fragments kiln's tensor-core kernels use, with 16-bit inputs and fp32 accumulators.
//
// WMMA leaves the mapping from a lane's fragment elements to matrix positions unspecified. Here
// each fragment use (matrix_a, matrix_b, accumulator) has its own scrambled mapping (an affine
// permutation of the 256 positions), so a kernel that assumes any layout, or that a and accumulator
// fragments share one, gives wrong answers under the emulator. Every call is warp-wide: each one
// waits for all 32 lanes (a diverged warp is caught), loads and stores check the alignment rules
// (pointer 256-bit aligned, leading dimension a multiple of 16 bytes), and mma_sync reads every
// lane's a, b and c before any lane writes its d, so d may alias c.
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

// The warp-wide part of a load or store: checks the pointer and ldm, waits for all 32 lanes, then
// calls visit(element, offset) for each of this lane's elements, offset being where the element's
// position (r, c) lies: r * ldm + c row-major, c * ldm + r column-major.
template <typename Use, typename Visit>
void each_element(const void* pointer, unsigned ldm, size_t element_bytes, bool row_major,
                  Visit visit) {
  check_layout(pointer, ldm, element_bytes);
  cuda_emulator::sync_warp(0xffffffffu);
  const int lane = cuda_emulator::lane();
  for (int e = 0; e < kPerLane; ++e) {
    const auto position = static_cast<unsigned>(detail::position<Use>(lane, e)), r = position / 16,
               c = position % 16;
    visit(e, row_major ? r * ldm + c : c * ldm + r);
  }
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
  detail::each_element<Use>(pointer, ldm, sizeof(T), std::is_same_v<Layout, row_major>,
                            [&](int e, unsigned offset) { f.x[e] = pointer[offset]; });
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* pointer,
                             unsigned ldm, layout_t layout) {
  detail::each_element<accumulator>(pointer, ldm, sizeof(float), layout == mem_row_major,
                                    [&](int e, unsigned offset) { f.x[e] = pointer[offset]; });
}

inline void store_matrix_sync(float* pointer, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::each_element<accumulator>(pointer, ldm, sizeof(float), layout == mem_row_major,
                                    [&](int e, unsigned offset) { pointer[offset] = f.x[e]; });
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
  // Once for the warp (the last lane in): the three 16 x 16 matrices gathered from the lanes'
  // fragments, then D = A B + C row-major into the warp's scratch.
  const auto multiply = [](const void* const* lanes, float* out) {
    float ma[256], mb[256];
    for (int slot = 0; slot < 256; ++slot) {
      const auto& operands = *static_cast<const Operands*>(lanes[slot / detail::kPerLane]);
      const int e = slot % detail::kPerLane, lane = slot / detail::kPerLane;
      ma[detail::position<matrix_a>(lane, e)] = detail::widen(operands.a->x[e]);
      mb[detail::position<matrix_b>(lane, e)] = detail::widen(operands.b->x[e]);
      out[detail::position<accumulator>(lane, e)] = operands.c->x[e];
    }
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k)
        for (int col = 0; col < 16; ++col) out[r * 16 + col] += ma[r * 16 + k] * mb[k * 16 + col];
  };
  cuda_emulator::gather(&mine, multiply);  // c is read before any lane writes d, which may alias it
  const float* product = cuda_emulator::warp_scratch();
  const int lane = cuda_emulator::lane();
  for (int e = 0; e < detail::kPerLane; ++e)
    d.x[e] = product[detail::position<accumulator>(lane, e)];
}

}  // namespace nvcuda::wmma
