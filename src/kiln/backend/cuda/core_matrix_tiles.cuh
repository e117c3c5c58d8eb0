// The attention kernels' products on Hopper (sm_90a): PaddedTiles' interface (flash_tiles.cuh) on
// wgmma (warpgroup_matrix.cuh; FlashAttention-3's instruction, Shah et al. 2024), the block's four
// warps being one warpgroup. A tile of 64 rows x HS is 8 x 8 core matrices (8 rows of 16
// contiguous bytes, 128 bytes) without swizzle, a column of eight of them (the tile's 64 rows,
// 1 KB) per 8 columns: element (r, c) at ((c / 8) 8 + r / 8) 64 + r % 8 * 8 + c % 8. So a tile
// read as Y^T (B[k][n] = Y[n][k]) or as the A rows of a product is K-major (core matrices 128
// bytes apart along the rows, 1 KB along the columns), and read as Y (B[k][n] = Y[k][n]) it is
// MN-major (1 KB apart along n, 128 bytes along k). Each product is waited for before it returns.
#pragma once

#include <cstdint>

#include "kiln/backend/cuda/flash_tiles.cuh"
#include "kiln/backend/cuda/warpgroup_matrix.cuh"

namespace kiln::cuda::flash {

template <typename T, int HS>
struct CoreMatrixTiles {
  static constexpr int kTile = kTileRows * HS;
  static constexpr uint32_t kRowGroupBytes = 128, kColumnGroupBytes = kTileRows * 16;
  static __device__ int offset(int row, int column) {
    return (column / 8 * 8 + row / 8) * 64 + row % 8 * 8 + column % 8;
  }
  // The copy of copy_tile (flash_tiles.cuh) into this layout: two threads per row take the 32
  // contiguous bytes of a pair of column groups (whole sectors of global memory).
  static __device__ void copy(T* tile, const T* source, int rows, int64_t stride, int hs) {
    for (int chunk = static_cast<int>(threadIdx.x); chunk < kTileRows * HS / 8; chunk += kThreads) {
      const int row = chunk / 2 % kTileRows, column = (chunk / (2 * kTileRows) * 2 + chunk % 2) * 8;
      const bool inside = row < rows && column < hs;
      copy_async_16(tile + offset(row, column), inside ? source + row * stride + column : source,
                    inside);
    }
  }
  static __device__ void landed() { shared_fence_for_async(); }
  // Columns [16 step, 16 step + 16) of a tile, K-major (as B = Y^T, or as A).
  static __device__ uint64_t columns(const T* tile, int step) {
    return matrix_descriptor(tile + offset(0, 16 * step), kColumnGroupBytes, kRowGroupBytes);
  }
  // Rows [16 step, 16 step + 16) of a tile from column column0 on (a multiple of 8), MN-major (as
  // B = Y, or as an M-major A = Y^T).
  static __device__ uint64_t rows(const T* tile, int step, int column0 = 0) {
    return matrix_descriptor(tile + offset(16 * step, column0), kRowGroupBytes, kColumnGroupBytes);
  }
  static __device__ void scores_from_tile(float (&s)[kTileRows / 8][4], const T* rows_tile, const T* tile) {
    start_scores_from_tile(s, rows_tile, tile);
    finish(s);
  }
  static __device__ void accumulate(float (&o)[HS / 8][4], const uint32_t (&p)[kTileRows / 16][4],
                                    const T* tile) {
    start_accumulate(o, p, tile);
    finish(o);  // before the tile is overwritten or o is read
  }
  // The same products issued without waiting (kAsynchronous), so that two independent ones overlap
  // on the tensor cores, or one overlaps other instructions; finish() waits for every product
  // started, before their accumulators are used, their A registers rewritten or their tiles
  // overwritten.
  static constexpr bool kAsynchronous = true;
  static __device__ void start_scores_from_tile(float (&s)[kTileRows / 8][4], const T* rows_tile,
                                                const T* tile) {
    warpgroup_fence();
#pragma unroll
    for (int step = 0; step < HS / 16; ++step)
      warpgroup_multiply<T, kTileRows, false, false>(s, columns(rows_tile, step), columns(tile, step),
                                                     step > 0);
    warpgroup_commit();
  }
  static __device__ void start_accumulate(float (&o)[HS / 8][4], const uint32_t (&p)[kTileRows / 16][4],
                                          const T* tile) {
    fence_operands(o);
    warpgroup_fence();  // o and p were written by ordinary instructions
#pragma unroll
    for (int step = 0; step < kTileRows / 16; ++step)  // k = the tile's rows [16 step, 16 step + 16)
      warpgroup_multiply<T, HS, true>(o, p[step], rows(tile, step), true);
    warpgroup_commit();
  }
  template <typename... Accumulators>
  static __device__ void finish(Accumulators&... accumulators) {
    warpgroup_wait<0>();
    (fence_operands(accumulators), ...);
  }
  // Waits for every product started but the last start_*() call's (each commits one group): for
  // the accumulators of the one before it, while the last one's still run.
  template <typename... Accumulators>
  static __device__ void finish_all_but_newest(Accumulators&... accumulators) {
    warpgroup_wait<1>();
    (fence_operands(accumulators), ...);
  }

  // A [64 x 64] score tile in this file's layout, read transposed as an M-major A by wgmma.
  static constexpr int kScoreTile = kTileRows * kTileRows;
  static constexpr int kTransposedColumns = 64;  // wgmma's N (warpgroup_matrix.cuh has 64 and 128)
  static __device__ void store_packed(T* scores, const uint32_t (&packed)[kTileRows / 16][4]) {
    const int row0 = static_cast<int>(threadIdx.x) / 32 * 16;
    for_each_packed_pair(packed, [&](uint32_t pair, int row, int column) {
      *reinterpret_cast<uint32_t*>(scores + offset(row0 + row, column)) = pair;
    });
  }
  // Waits for every product started, as finish() does.
  template <int N>
  static __device__ void multiply_transposed(float (&acc)[N / 8][4], const T* scores, const T* tile, int column0) {
    warpgroup_fence();
#pragma unroll
    for (int step = 0; step < kTileRows / 16; ++step)  // k = S's rows and the tile's [16 step, 16 step + 16)
      warpgroup_multiply<T, N, true, true>(acc, rows(scores, step), rows(tile, step, column0), step > 0);
    warpgroup_commit();
    finish(acc);
  }
};

}  // namespace kiln::cuda::flash
