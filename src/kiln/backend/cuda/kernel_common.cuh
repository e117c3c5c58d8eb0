// Helpers shared by the CUDA back-end's kernel files (one .cu per op family): launch geometry,
// warp and block reductions, the deterministic column sums, and the dispatch from an element kind
// (kernels.h) to its storage type. Device code and inline host helpers only; .cu files include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kiln/backend/cuda/element.cuh"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch.cuh"

namespace kiln::cuda {

constexpr int kThreads = 256;

inline int blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Block-wide sum for blockDim.x == kThreads; every thread gets the result.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float shared[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kThreads / 32 ? shared[lane] : 0.0f;
  value = warp_sum(value);
  __syncthreads();
  return value;
}

__device__ __forceinline__ float block_max(float value) {
  __shared__ float shared[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_max(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kThreads / 32 ? shared[lane] : -INFINITY;
  value = warp_max(value);
  __syncthreads();
  return value;
}

// Calls visit(pack, at) for each pack of W elements of `base` at the element offsets at = first,
// first + stride, ... below `end`, loading kInFlight packs before visiting any, so that a thread of
// a memory-bound kernel keeps kInFlight loads in flight rather than waiting on each. Index is the
// offsets' type (int where a kernel's registers are tight).
template <int kInFlight, int W, typename T, typename Index, typename Visit>
__device__ __forceinline__ void for_each_pack(const T* base, Index first, Index stride, Index end, Visit visit) {
  for (; first < end; first += kInFlight * stride) {
    Pack<T, W> packs[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (first + i * stride < end) packs[i] = Pack<T, W>::load(base + first + i * stride);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (first + i * stride < end) visit(packs[i], first + i * stride);
  }
}

#define GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Raises a kernel's dynamic shared memory limit to `bytes`; false, the error cleared, where this
// GPU gives a block less (an H100 227 KB, an A100 163, others 99), so that the caller launches
// another form (host side).
template <typename Kernel>
bool allow_shared_memory(Kernel kernel, size_t bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
      cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

// Calls launch(T{}) with T the storage type of `kind`; returns its status.
template <typename Launch>
int dispatch(int kind, Launch launch) {
  switch (kind) {
    case kFp32: return launch(float{});
    case kBf16: return launch(__nv_bfloat16{});
    case kFp16: return launch(__half{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// Calls launch(std::integral_constant<int, W>{}) with W = kPackWidth<T> where packs_fit(extent,
// pointers), else W = 1 (element.cuh); returns its status. Kernels templated on W then move rows
// of `extent` elements W at a time.
template <typename T, typename Launch>
int with_pack_width(int64_t extent, std::initializer_list<const void*> pointers, Launch launch) {
  if (packs_fit<T>(extent, pointers)) return launch(std::integral_constant<int, kPackWidth<T>>{});
  return launch(std::integral_constant<int, 1>{});
}

// Column sums without atomics, in a fixed order, spread over many blocks: the rows are cut into
// column_sum_chunks(M) chunks; block (x, y) sums 32 W columns over chunk y, thread x taking W
// adjacent columns (one 16-byte pack where W = kPackWidth) with kRowGroups warps striding over the
// chunk's rows, adds the warps' sums in order through shared memory and writes them to
// partials[y][column]; column_sums_finish() then adds the chunks in a fixed order into the result. Each
// column's order of addition depends only on M, not on W or the GPU, so the bits do not either.
// (One block per 32 columns alone, the first version, left 24 blocks for C = 768 and most of an
// H100 idle.)
constexpr int kRowGroups = 8;

inline int64_t column_sum_chunks(int64_t M) {
  const int64_t chunks = M / 512;
  return chunks < 1 ? 1 : chunks > 64 ? 64 : chunks;
}

inline dim3 column_sums_grid(int64_t M, int64_t N, int W) {
  return dim3(static_cast<unsigned>((N + 32 * W - 1) / (32 * W)),
              static_cast<unsigned>(column_sum_chunks(M)));
}

// The partial pass, inside a kernel launched with column_sums_grid(M, N, W) blocks of
// (32, kRowGroups) threads (N a multiple of W): term(m, n, a, b) adds row m's two summands of
// columns [n, n + W) into a[0..W) and b[0..W); partial_b may be null.
template <int W, typename Term>
__device__ __forceinline__ void column_sums_partial(float* partial_a, float* partial_b, int64_t M,
                                                    int64_t N, Term term) {
  __shared__ float shared_a[kRowGroups][32 * W + 1], shared_b[kRowGroups][32 * W + 1];
  const int64_t column = (blockIdx.x * 32 + threadIdx.x) * static_cast<int64_t>(W);
  const int64_t rows_per_chunk = (M + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < M ? begin + rows_per_chunk : M;
  float a[W] = {}, b[W] = {};
  if (column < N)
    for (int64_t m = begin + threadIdx.y; m < end; m += kRowGroups) term(m, column, a, b);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    shared_a[threadIdx.y][threadIdx.x * W + w] = a[w];
    shared_b[threadIdx.y][threadIdx.x * W + w] = b[w];
  }
  __syncthreads();
  if (threadIdx.y == 0 && column < N) {
#pragma unroll
    for (int w = 0; w < W; ++w) {
      for (int g = 1; g < kRowGroups; ++g) {
        a[w] += shared_a[g][threadIdx.x * W + w];
        b[w] += shared_b[g][threadIdx.x * W + w];
      }
      partial_a[blockIdx.y * N + column + w] = a[w];
      if (partial_b) partial_b[blockIdx.y * N + column + w] = b[w];
    }
  }
}

// sums_a[n] += (or, with overwrite, =) the sum over `chunks` rows of partial_a[chunk][n], in an
// order that depends only on `chunks`; likewise b when non-null. Defined in bias.cu.
int column_sums_finish(float* sums_a, float* sums_b, const float* partial_a, const float* partial_b, int64_t chunks,
                       int64_t N, bool overwrite);

}  // namespace kiln::cuda
