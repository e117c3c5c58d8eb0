// fp8 casts for the fp8 products and the delayed-scaling update (kernels.h, ops.h). A cast reads a
// 32 x 32 tile of the 16-bit input once and writes it as 8-bit codes in the same layout, in the
// transposed one through shared memory, or both (cuBLASLt's fp8 products want both operands
// K-contiguous, so a backward needs the transposes of forward's operands), and folds the tile's
// max |x| into the tensor's amax with one atomic max per block.
#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/core/fp8_codec.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace kiln::cuda {
namespace {

constexpr int kTile = 32;

__device__ __forceinline__ uint8_t to_fp8(float value, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The conversion instruction: the same function as fp8::encode (nearest even, saturating).
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
#else
  return fp8::encode(value, e4m3 ? fp8::Format::E4M3 : fp8::Format::E5M2);
#endif
}

// amax >= 0 and a float's bits order like signed integers for non-negative values.
__device__ __forceinline__ void max_into(float* amax, float value) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(value));
}

// Block (x, y) casts the tile of rows [32 y, 32 y + 32) and columns [32 x, 32 x + 32); each of the
// kThreads threads (lane = column in the tile, warp w) takes rows w, w + 8, w + 16, w + 24.
template <typename T>
__global__ void cast_fp8_kernel(const T* in, int64_t rows, int64_t cols, const float* scale_pointer,
                                float* amax, bool e4m3, uint8_t* out, uint8_t* out_t) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile,
                col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const float scale = *scale_pointer;
  float largest = 0.0f;
  for (int r = warp; r < kTile; r += kThreads / 32) {
    const int64_t row = row0 + r, col = col0 + lane;
    if (row < rows && col < cols) {
      const float value = to_float(in[row * cols + col]);
      largest = fmaxf(largest, fabsf(value));
      const uint8_t code = to_fp8(value * scale, e4m3);
      if (out) out[row * cols + col] = code;
      tile[r][lane] = code;
    }
  }
  largest = block_max(largest);  // synchronises the block: the tile is complete
  if (threadIdx.x == 0) max_into(amax, largest);
  if (!out_t) return;
  for (int c = warp; c < kTile; c += kThreads / 32) {
    const int64_t col = col0 + c, row = row0 + lane;
    if (row < rows && col < cols) out_t[col * rows + row] = tile[lane][c];
  }
}

// One thread per tensor: the rule of ops.h, Fp8UpdateScales, as the CPU reference computes it.
__global__ void fp8_update_scales_kernel(float* state, int64_t tensors, int64_t history_column,
                                         int64_t history, int64_t position, bool use_history_max,
                                         int margin) {
  const int64_t tensor = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tensor >= tensors) return;
  float* r = state + tensor * (history_column + history);
  float* past = r + history_column;
  past[position] = r[2];
  float seen = r[2];
  if (use_history_max)
    for (int64_t i = 0; i < history; ++i) seen = fmaxf(seen, past[i]);
  if (seen < INFINITY && seen > 0.0f) {  // finite and positive (seen is never NaN: fmaxf drops NaN)
    r[0] = ldexpf(r[3] / seen, -margin);
    r[1] = 1.0f / r[0];
  }
  r[2] = 0.0f;
}

}  // namespace

int cast_fp8(const void* in, int kind, int64_t rows, int64_t cols, const float* scale, float* amax,
             bool e4m3, uint8_t* out, uint8_t* out_t) {
  if (rows == 0 || cols == 0) return 0;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(cast_fp8_kernel<E>, grid, kThreads, 0, static_cast<const E*>(in), rows, cols, scale,
           amax, e4m3, out, out_t);
    return launch_status();
  });
}

int fp8_update_scales(float* state, int64_t tensors, int64_t history_column, int64_t history,
                      int64_t position, bool use_history_max, int margin) {
  launch(fp8_update_scales_kernel, blocks_for(tensors), kThreads, 0, state, tensors, history_column,
         history, position, use_history_max, margin);
  return launch_status();
}

}  // namespace kiln::cuda
