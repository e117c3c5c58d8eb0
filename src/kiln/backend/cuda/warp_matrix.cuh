// The PTX warp-level matrix instructions and asynchronous copies of sm_80 and newer, for kernels
// that keep their matrix fragments in registers (flash_tiles.cuh). Unlike WMMA, whose fragment
// layout is unspecified, these have the layouts the PTX ISA documents (section "Matrix Fragments
// for mma.m16n8k16 with floating point type", and ldmatrix), so a kernel may compute with the
// elements it holds. With groupID g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major) a[0..3]: (g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
//   B (16 x 8, "col")      b[0..1]: rows 2t..2t+1 of column g, and rows 2t + 8..2t + 9
//   C/D (16 x 8, fp32)     c[0..3]: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
// Each 32-bit register holds two 16-bit elements, the lower-numbered one in the low half.
// ldmatrix x4: lane 8j + r gives the shared address of row r of 8 x 8 matrix j (16 bytes, 16-byte
// aligned); register j of lane 4r + w is then elements 2w, 2w + 1 of that row (.trans: of column r,
// i.e. rows 2w, 2w + 1 of the column).
//
// Device code only; every call is warp-wide (all 32 lanes, converged), as the instructions ask.
// Built by a host compiler for tests/cuda_emulator, the same functions are the emulator's, which
// implements the documented layouts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/backend/cuda/element.cuh"

namespace kiln::cuda {

// Two elements of a 16-bit type packed as one fragment register: `low` in bits 0-15.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  const T pair[2] = {from_float<T>(low), from_float<T>(high)};
  uint32_t bits;
  memcpy(&bits, pair, sizeof(bits));
  return bits;
}

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory (see the header comment).
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#endif
}

// d += a b, m16n8k16, 16-bit inputs of type T (bf16 or fp16), fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16x8x16 takes bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// 16 bytes from global to shared memory without passing through registers (cp.async.cg); when
// `inside` is false the 16 bytes become zeros and `source` is not read. Lands only after the
// thread's copy_wait covering its group; other threads see it after a __syncthreads that follows.
__device__ __forceinline__ void copy_async_16(void* shared_destination, const void* source,
                                              bool inside) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared_destination)),
      "l"(source), "r"(inside ? 16 : 0)
      : "memory");
#endif
}
// Closes the calling thread's group of copies issued since the last commit.
__device__ __forceinline__ void copy_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `Pending` of the calling thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void copy_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

#else  // a host compiler building the kernels against tests/cuda_emulator/include

inline void load_matrices(uint32_t (&r)[4], const void* row) {
  ::cuda_emulator::load_matrices(r, row, false);
}
inline void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
  ::cuda_emulator::load_matrices(r, row, true);
}
template <typename T>
void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "mma_16x8x16 takes bf16 or fp16");
  ::cuda_emulator::mma_16x8x16(d, a, b, std::is_same_v<T, __nv_bfloat16>);
}
inline void copy_async_16(void* shared_destination, const void* source, bool inside) {
  ::cuda_emulator::copy_async(shared_destination, source, inside ? 16 : 0);
}
inline void copy_commit() { ::cuda_emulator::copy_commit(); }
template <int Pending>
void copy_wait() {
  ::cuda_emulator::copy_wait(Pending);
}

#endif

}  // namespace kiln::cuda
