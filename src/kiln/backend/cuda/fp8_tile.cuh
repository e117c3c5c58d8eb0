// The pieces of an fp8 cast that the cast kernel (fp8.cu), the LayerNorms that cast
// (layernorm_fp8.cu) and the cross-entropy that casts its gradient (cross_entropy.cu) share: the
// conversion, a pack's codes, the amax update, and the transposed write of codes staged in shared
// memory. Device code only; .cu files include it.
#pragma once

#include <cstring>

#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/backend/fp8_workspace.h"
#include "kiln/core/fp8_codec.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace kiln::cuda {

// A block casts tiles of kFp8TileRows x kFp8TileColumns elements, kFp8Vector a thread.
constexpr int kFp8TileRows = kFp8CastTileRows, kFp8TileColumns = 128, kFp8Vector = 4;
static_assert(kFp8TileColumns == 32 * kFp8Vector && kFp8TileColumns * kFp8TileRows == kThreads * 16);

// A tile of codes in shared memory, rows 132 bytes apart (4-byte stores by row, byte reads by column).
using Fp8Tile = uint8_t[kFp8TileRows][kFp8TileColumns + 4];

__device__ __forceinline__ uint8_t to_fp8(float value, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The conversion instruction: the same function as fp8::encode (nearest even, saturating).
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
#else
  return fp8::encode(value, e4m3 ? fp8::Format::E4M3 : fp8::Format::E5M2);
#endif
}

// The W codes of one pack of W elements (Pack, element.cuh): stored to memory as one W-byte access
// (`at` W-byte aligned), or, for W a multiple of 4, staged into a shared row of codes 4 bytes at a
// time (a staged row is 4-byte aligned, not W).
template <int W>
struct alignas(W) CodePack {
  uint8_t code[W];
  __device__ __forceinline__ void store(uint8_t* at) const { *reinterpret_cast<CodePack*>(at) = *this; }
  __device__ __forceinline__ void stage(uint8_t* at) const {
    static_assert(W % 4 == 0);
    uint32_t words[W / 4];
    memcpy(words, code, W);
#pragma unroll
    for (int i = 0; i < W / 4; ++i) reinterpret_cast<uint32_t*>(at)[i] = words[i];
  }
};

// amax >= 0 and a float's bits order like signed integers for non-negative values.
__device__ __forceinline__ void max_into(float* amax, float value) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(value));
}

// 16 consecutive codes of one column of a tile staged in shared memory, from `first` on (rows
// `pitch` bytes apart), as one 16-byte piece of the transposed matrix's row.
__device__ __forceinline__ uint4 column_piece(const uint8_t* first, int pitch) {
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    words[w] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) words[w] |= static_cast<uint32_t>(first[(4 * w + b) * pitch]) << (8 * b);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Writes rows [row0, row0 + 32) and columns [col0, col0 + columns) of a rows x cols matrix of
// codes, staged in shared memory from `staged` on (the rows `pitch` bytes apart), into its
// transpose out_t [cols, rows]: thread t writes half t % 2 (16 rows) of staged columns t / 2,
// t / 2 + kThreads / 2, ..., each as one 16-byte row piece. Call after a barrier that completes the
// staging; rows is a multiple of 16, so a piece is whole or absent. With `pitch` 4 more than a
// multiple of 8, the two halves' bytes of a column lie 16 banks apart.
__device__ __forceinline__ void store_fp8_columns_transposed(const uint8_t* staged, int pitch, int columns,
                                                             uint8_t* out_t, int64_t row0, int64_t col0, int64_t rows,
                                                             int64_t cols) {
  const int first = threadIdx.x % 2 * 16;
  const int64_t out_col = row0 + first;
  if (out_col >= rows) return;
  for (int c = threadIdx.x / 2; c < columns && col0 + c < cols; c += kThreads / 2)
    *reinterpret_cast<uint4*>(out_t + (col0 + c) * rows + out_col) = column_piece(staged + first * pitch + c, pitch);
}

// The same for a tile of kFp8TileColumns columns from col0 on, staged in an Fp8Tile.
__device__ __forceinline__ void store_fp8_tile_transposed(const Fp8Tile& tile, uint8_t* out_t, int64_t row0,
                                                          int64_t col0, int64_t rows, int64_t cols) {
  store_fp8_columns_transposed(&tile[0][0], sizeof(tile[0]), kFp8TileColumns, out_t, row0, col0, rows, cols);
}

}  // namespace kiln::cuda
