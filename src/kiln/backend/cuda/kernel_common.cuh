// Helpers shared by the CUDA back-end's kernel files (one .cu per op family): launch geometry,
// warp and block reductions, the deterministic column sums, and the dispatch from an element kind
// (kernels.h) to its storage type. Device code and inline host helpers only; .cu files include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backend/cuda/element.cuh"
#include "kiln/backend/cuda/kernels.h"

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

#define GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

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

// Column sums without atomics, in a fixed order: a block owns 32 columns; its kRowGroups warps
// stride over the rows (coalesced reads per row), then the partial sums are added in row-group
// order through shared memory.
constexpr int kRowGroups = 32;

template <typename Term>
__device__ __forceinline__ void column_sums(float* sums_a, float* sums_b, int64_t M, int64_t N, Term term) {
  __shared__ float partial_a[kRowGroups][33], partial_b[kRowGroups][33];
  const int64_t column = blockIdx.x * 32 + threadIdx.x;
  float a = 0.0f, b = 0.0f;
  if (column < N) {
    for (int64_t m = threadIdx.y; m < M; m += kRowGroups) {
      const float2 values = term(m, column);
      a += values.x;
      b += values.y;
    }
  }
  partial_a[threadIdx.y][threadIdx.x] = a;
  partial_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && column < N) {
    for (int g = 1; g < kRowGroups; ++g) {
      a += partial_a[g][threadIdx.x];
      b += partial_b[g][threadIdx.x];
    }
    sums_a[column] += a;
    if (sums_b) sums_b[column] += b;
  }
}

}  // namespace kiln::cuda
