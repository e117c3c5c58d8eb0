// The fp8 ending of the attention kernels (flash_forward.cu, flash_backward.cu; ops.h, the
// attention ops with fp8; flash_attention.h, AttentionCodes): a block's tile of up to 64 positions
// x hs channels (the forward's output, or one of dq, dk, dv), each warp's 16 rows in m16n8
// accumulators (flash_tiles.cuh), is written as codes, in both layouts, for c_proj's fp8 forward
// or c_attn's fp8 backward. Three phases between barriers, in the shared memory the kernel's tiles
// used: stage_tile() stores the values rounded to the storage type as store_rows() would store
// them in global memory; cast_staged_tile() casts them to codes, one thread a column, summing the
// column's rows where asked (a tile's partial sum of a bias gradient) and folding max |x| into the
// amax; store_tile_codes() writes the codes by rows and transposed. write_tile_codes() runs the
// three for one tile. Device code only.
#pragma once

#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/flash_tiles.cuh"
#include "kiln/backend/cuda/fp8_tile.cuh"

namespace kiln::cuda::flash {

// Bytes a staged row of codes takes: a multiple of 8 (8-byte row reads), past the head's width.
template <int HS>
constexpr int kCodesPitch = HS + 16;

// Shared memory one tile's ending takes: the rounded gradient (a tile's layout, flash_tiles.cuh),
// then its codes.
template <typename T, int HS>
constexpr size_t kStagedTileBytes = static_cast<size_t>(kTileRows) * kPitch<HS> * sizeof(T);
template <typename T, int HS>
constexpr size_t kTileCodesSharedBytes = kStagedTileBytes<T, HS> + static_cast<size_t>(kTileRows) * kCodesPitch<HS>;

// Where a block's tile goes: positions [row0, row0 + rows) of the [M, N] matrix (M = B*T; N = C
// for the output, 3C for dqkv), channels [column0, column0 + hs), partial-sum row partial_row.
struct CodesTile {
  int64_t M, N, row0, column0, partial_row;
  int rows, hs;
};

// The tile of the block's (batch, head) = blockIdx.y, positions from `first` (a multiple of 64) of
// part `part` of `parts` C-wide parts (the output: 0 of 1; dqkv: 0 q, 1 k, 2 v of 3); its partial
// row is the sequence's tile first / 64 (a block may take more than one).
__device__ inline CodesTile codes_tile(int NH, int T_, int hs, int first, int part, int parts) {
  const int b = static_cast<int>(blockIdx.y) / NH, h = static_cast<int>(blockIdx.y) % NH;
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t tiles_per_sequence = (T_ + kTileRows - 1) / kTileRows;
  return {static_cast<int64_t>(gridDim.y) / NH * T_, parts * C, static_cast<int64_t>(b) * T_ + first,
          part * C + static_cast<int64_t>(h) * hs, b * tiles_per_sequence + first / kTileRows,
          min(kTileRows, T_ - first), hs};
}

// Phase one, every thread, after a barrier that frees `shared` (kTileCodesSharedBytes<T, HS>
// bytes): the warp's rows of the tile, its first `rows` rows and `hs` columns, times `factor` (of
// rows group and group + 8, as store_rows takes it), rounded to T as they would be stored.
// Nothing more while the accumulators hold registers.
template <typename T, int HS>
__device__ void stage_tile(const float (&acc)[HS / 8][4], const float (&factor)[2], int rows, int hs,
                           unsigned char* shared) {
  store_rows<T, HS>(reinterpret_cast<T*>(shared), kPitch<HS>, rows, hs, static_cast<int>(threadIdx.x) / 32 * 16, acc,
                    factor);
}

// Phase two, every thread, after a barrier that completes phase one: thread c < hs casts column c
// of the staged tile into the staged codes, adding its rows in order (its partial sum, where
// codes.column_partials is given) and folding max |x| into the amax.
template <typename T, int HS>
__device__ __noinline__ void cast_staged_tile(const AttentionCodes& codes, const CodesTile& tile,
                                     unsigned char* shared) {
  static_assert(HS <= kThreads, "a thread a column");
  const T* const staged = reinterpret_cast<const T*>(shared);
  unsigned char* const staged_codes = shared + kStagedTileBytes<T, HS>;
  const int column = static_cast<int>(threadIdx.x);
  const float scale = *codes.scale;
  float largest = 0.0f;
  if (column < tile.hs) {
    float sum = 0.0f;  // unused without partial sums
    for (int row = 0; row < tile.rows; ++row) {
      const float value = to_float(staged[row * kPitch<HS> + column]);
      largest = fmaxf(largest, fabsf(value));
      sum += value;
      staged_codes[row * kCodesPitch<HS> + column] = to_fp8(value * scale, codes.e4m3);
    }
    if (codes.column_partials) codes.column_partials[tile.partial_row * tile.N + tile.column0 + column] = sum;
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) largest = fmaxf(largest, __shfl_xor_sync(kFullWarp, largest, mask));
  if (threadIdx.x % 32 == 0) max_into(codes.amax, largest);
}

// Phase three, every thread, after a barrier that completes phase two: the staged codes by rows
// and transposed.
template <typename T, int HS>
__device__ __noinline__ void store_tile_codes(const AttentionCodes& codes, const CodesTile& tile,
                                     const unsigned char* shared_tile) {
  const unsigned char* const shared = shared_tile + kStagedTileBytes<T, HS>;
  const int chunks = tile.hs / 8;  // by rows: 8 bytes a thread
  for (int i = static_cast<int>(threadIdx.x); i < tile.rows * chunks; i += kThreads) {
    const int row = i / chunks, chunk = i % chunks;
    *reinterpret_cast<uint2*>(codes.rows + (tile.row0 + row) * tile.N + tile.column0 + chunk * 8) =
        *reinterpret_cast<const uint2*>(shared + row * kCodesPitch<HS> + chunk * 8);
  }
  // Transposed (unless not wanted: null columns): 16 positions a thread where they start 16-byte
  // aligned (T a multiple of 16), else one at a time.
  if (!codes.columns) return;
  if (tile.row0 % 16 == 0 && tile.rows % 16 == 0) {
    const int pieces = tile.rows / 16;
    for (int i = static_cast<int>(threadIdx.x); i < tile.hs * pieces; i += kThreads) {
      const int column = i / pieces, first = i % pieces * 16;
      *reinterpret_cast<uint4*>(codes.columns + (tile.column0 + column) * tile.M + tile.row0 + first) =
          column_piece(shared + first * kCodesPitch<HS> + column, kCodesPitch<HS>);
    }
  } else {
    for (int i = static_cast<int>(threadIdx.x); i < tile.hs * tile.rows; i += kThreads) {
      const int column = i / tile.rows, row = i % tile.rows;
      codes.columns[(tile.column0 + column) * tile.M + tile.row0 + row] = shared[row * kCodesPitch<HS> + column];
    }
  }
}

// The three phases for a block's one tile of part `part` of `parts` (codes_tile), from position
// `first`, barriers included: call after the kernel's last read of its tiles, with every warp's
// accumulators final.
template <typename T, int HS>
__device__ void write_tile_codes(const float (&acc)[HS / 8][4], const float (&factor)[2], const AttentionCodes& codes,
                                 int NH, int T_, int hs, int first, int part, int parts, unsigned char* shared) {
  __syncthreads();  // no warp still reads the tiles, whose memory now stages this one
  stage_tile<T, HS>(acc, factor, min(kTileRows, T_ - first), hs, shared);
  __syncthreads();
  const CodesTile tile = codes_tile(NH, T_, hs, first, part, parts);
  cast_staged_tile<T, HS>(codes, tile, shared);
  __syncthreads();
  store_tile_codes<T, HS>(codes, tile, shared);
}

}  // namespace kiln::cuda::flash
