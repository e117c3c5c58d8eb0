// The warpgroup matrix instructions of sm_90a (wgmma.mma_async), for kernels whose block is one
// warpgroup: four warps, 128 threads. Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate": register fragments, and "Shared Memory Matrix Layout", canonical layouts)
// with groupID g = lane / 4 and t = lane % 4 of warp w:
//   A (64 x 16, registers): warp w holds rows [16w, 16w + 16) in the mma.sync m16n8k16 A layout
//     (warp_matrix.cuh), so the fragments kernels build for mma.sync serve here unchanged. Or A
//     from shared memory by descriptor, K-major or M-major (transposed): element (m, k) as B's
//     K-major or MN-major (k, n) with m for n.
//   D (64 x N, fp32): warp w holds rows [16w, 16w + 16) as N / 8 m16n8 accumulators, d[j][i] at
//     row g + 8 (i / 2), column 8j + 2t + i % 2: the layout of N / 8 mma.sync products side by side.
//   B (16 x N, shared memory), by a matrix descriptor, without swizzle: 8 x 8 core matrices of 8
//     rows of 16 contiguous bytes, LBO and SBO the byte distances between core matrices:
//       K-major               element (k, n) at n % 8 * 16 + n / 8 * SBO + k % 8 * 2 + k / 8 * LBO
//       MN-major (TransposeB) element (k, n) at n % 8 * 2 + n / 8 * SBO + k % 8 * 16 + k / 8 * LBO
// Ordering (PTX ISA): warpgroup_fence() before the first multiply and whenever other instructions
// have written its accumulator or A registers; the products are asynchronous, so their
// accumulators are not read or written, and their shared memory is not overwritten, until
// warpgroup_commit() and then warpgroup_wait<n>() cover them (fence_operands() after the wait
// keeps the compiler from moving accumulator reads before it). Shared memory written by ordinary
// stores or cp.async needs shared_fence_for_async() in each writing thread before the barrier
// that precedes the multiply.
//
// Device code for sm_90a only: compiled for any other target the multiply traps (hosts dispatch
// these kernels only where KILN_CUDA_WGMMA says the build has sm_90a code). Built by a host
// compiler for tests/cuda_emulator, the same functions are the emulator's, which implements the
// layouts above (no swizzle only) and runs each product at the wait that covers it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backend/cuda/warp_matrix.cuh"

namespace kiln::cuda {

// A shared-memory matrix descriptor: start address, LBO and SBO in 16-byte units in bits 0-13,
// 16-29 and 32-45; base offset 0 and no swizzle (bits 49-51 and 62-63 zero).
__host__ __device__ constexpr uint64_t descriptor_bits(uint32_t address, uint32_t leading_bytes,
                                                       uint32_t stride_bytes) {
  return (address >> 4 & 0x3fffu) | static_cast<uint64_t>(leading_bytes >> 4 & 0x3fffu) << 16 |
         static_cast<uint64_t>(stride_bytes >> 4 & 0x3fffu) << 32;
}

// The shapes and input types warpgroup_multiply has (both operand forms, device and emulator).
template <typename T, int N>
__host__ __device__ constexpr void check_warpgroup_operands() {
  static_assert(N == 64 || N == 128, "warpgroup_multiply has N = 64 and 128");
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "warpgroup_multiply takes bf16 or fp16");
}

// Pins every accumulator register in place for the compiler around asynchronous products.
template <int J>
__device__ __forceinline__ void fence_operands(float (&d)[J][4]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
#else
  (void)d;
#endif
}

#if defined(__CUDACC__)

__device__ __forceinline__ uint64_t matrix_descriptor(const void* tile, uint32_t leading_bytes,
                                                      uint32_t stride_bytes) {
  return descriptor_bits(shared_address(tile), leading_bytes, stride_bytes);
}

__device__ __forceinline__ void warpgroup_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void warpgroup_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void warpgroup_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
// Orders this thread's earlier shared-memory writes (stores, cp.async once waited for) before
// later reads by the tensor cores (the async proxy).
__device__ __forceinline__ void shared_fence_for_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The instruction text and accumulator operands for each shape and input type.
#define KILN_WGMMA_ACCUMULATORS_64 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
    "+f"(d[7][2]), "+f"(d[7][3])
#define KILN_WGMMA_ACCUMULATORS_128 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
    "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
    "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
    "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
    "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
    "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), \
    "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
    "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define KILN_WGMMA_64_BF16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "{%32, %33, %34, %35}, %36, accumulate, 1, 1, %38;\n}\n"
#define KILN_WGMMA_64_F16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "{%32, %33, %34, %35}, %36, accumulate, 1, 1, %38;\n}\n"
#define KILN_WGMMA_128_BF16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %69, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
  "{%64, %65, %66, %67}, %68, accumulate, 1, 1, %70;\n}\n"
#define KILN_WGMMA_128_F16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %69, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
  "{%64, %65, %66, %67}, %68, accumulate, 1, 1, %70;\n}\n"

#define KILN_WGMMA_SHARED_A_64_BF16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "%32, %33, accumulate, 1, 1, %36, %35;\n}\n"
#define KILN_WGMMA_SHARED_A_64_F16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "%32, %33, accumulate, 1, 1, %36, %35;\n}\n"
#define KILN_WGMMA_SHARED_A_128_BF16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
  "%64, %65, accumulate, 1, 1, %68, %67;\n}\n"
#define KILN_WGMMA_SHARED_A_128_F16 \
  "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
  "%64, %65, accumulate, 1, 1, %68, %67;\n}\n"

// d (+)= a b for this warpgroup's 64 rows: a [64 x 16] in registers, b [16 x N] by descriptor;
// `accumulate` false overwrites d. Issues the product; see the header comment for the ordering.
template <typename T, int N, bool TransposeB>
__device__ __forceinline__ void warpgroup_multiply(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                                   uint64_t b, bool accumulate) {
  check_warpgroup_operands<T, N>();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (N == 64 && bf16)
    asm volatile(KILN_WGMMA_64_BF16 : KILN_WGMMA_ACCUMULATORS_64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0));
  else if constexpr (N == 64)
    asm volatile(KILN_WGMMA_64_F16 : KILN_WGMMA_ACCUMULATORS_64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0));
  else if constexpr (bf16)
    asm volatile(KILN_WGMMA_128_BF16 : KILN_WGMMA_ACCUMULATORS_128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0));
  else
    asm volatile(KILN_WGMMA_128_F16 : KILN_WGMMA_ACCUMULATORS_128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0));
#elif defined(__CUDA_ARCH__)
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();  // not sm_90a code: the host should not have launched this kernel
#endif
}

// The same with a [64 x 16] from shared memory too, by descriptor: K-major (the B layouts' K-major
// formula with m for n: row m of a core matrix is 16 bytes of k), or M-major when TransposeA (the
// MN-major formula with m for n: row k of a core matrix is 16 bytes of m).
template <typename T, int N, bool TransposeA, bool TransposeB>
__device__ __forceinline__ void warpgroup_multiply(float (&d)[N / 8][4], uint64_t a, uint64_t b,
                                                   bool accumulate) {
  check_warpgroup_operands<T, N>();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (N == 64 && bf16)
    asm volatile(KILN_WGMMA_SHARED_A_64_BF16 : KILN_WGMMA_ACCUMULATORS_64
                 : "l"(a), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0), "n"(TransposeA ? 1 : 0));
  else if constexpr (N == 64)
    asm volatile(KILN_WGMMA_SHARED_A_64_F16 : KILN_WGMMA_ACCUMULATORS_64
                 : "l"(a), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0), "n"(TransposeA ? 1 : 0));
  else if constexpr (bf16)
    asm volatile(KILN_WGMMA_SHARED_A_128_BF16 : KILN_WGMMA_ACCUMULATORS_128
                 : "l"(a), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0), "n"(TransposeA ? 1 : 0));
  else
    asm volatile(KILN_WGMMA_SHARED_A_128_F16 : KILN_WGMMA_ACCUMULATORS_128
                 : "l"(a), "l"(b), "r"(scale_d), "n"(TransposeB ? 1 : 0), "n"(TransposeA ? 1 : 0));
#elif defined(__CUDA_ARCH__)
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();  // not sm_90a code: the host should not have launched this kernel
#endif
}

#else  // a host compiler building the kernels against tests/cuda_emulator/include

inline uint64_t matrix_descriptor(const void* tile, uint32_t leading_bytes, uint32_t stride_bytes) {
  return descriptor_bits(::cuda_emulator::shared_offset(tile), leading_bytes, stride_bytes);
}
inline void warpgroup_fence() {}
inline void warpgroup_commit() { ::cuda_emulator::commit_warp_work(); }
template <int Pending>
void warpgroup_wait() {
  ::cuda_emulator::wait_warp_work(Pending);
}
inline void shared_fence_for_async() {}
template <typename T, int N, bool TransposeB>
void warpgroup_multiply(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  check_warpgroup_operands<T, N>();
  ::cuda_emulator::warpgroup_multiply(&d[0][0], N, a, b, TransposeB, std::is_same_v<T, __nv_bfloat16>,
                                      accumulate);
}
template <typename T, int N, bool TransposeA, bool TransposeB>
void warpgroup_multiply(float (&d)[N / 8][4], uint64_t a, uint64_t b, bool accumulate) {
  check_warpgroup_operands<T, N>();
  ::cuda_emulator::warpgroup_multiply_shared_a(&d[0][0], N, a, b, TransposeA, TransposeB,
                                               std::is_same_v<T, __nv_bfloat16>, accumulate);
}

#endif

}  // namespace kiln::cuda
