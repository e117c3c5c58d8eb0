// The tile plumbing shared by the tensor-core attention kernels (flash_forward.cu,
// flash_backward.cu): 64-row tiles of a head's rows in shared memory, and one warp's products
// over them with mma.sync fragments in registers (warp_matrix.cuh states the layouts).
//
// Conventions: a tile is [64][kPitch<HS>] elements of a 16-bit type T, HS = 64 or 128 wide, rows
// padded by 16 bytes so that the 8 row addresses of an ldmatrix fall in distinct banks. A warp owns
// 16 rows of its products; an m16n8 accumulator `float[4]` holds, for groupID g = lane / 4 and
// t = lane % 4, rows g (elements 0, 1) and g + 8 (2, 3) at columns 2t and 2t + 1 of its 8.
// Blocks are kThreads threads (four warps). Device code only; kernels wrap their bodies in
// `#if KILN_TENSOR_CORE_BODIES` (below). PaddedTiles (end of file) packages these products as the
// tile interface the kernels take; core_matrix_tiles.cuh offers the same on Hopper's wgmma.
// Attention dropout's mask of a tile (ops.h, AttentionDropout) is drawn in registers too: the
// keep_* functions before PaddedTiles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backend/cuda/element.cuh"
#include "kiln/backend/cuda/warp_matrix.cuh"
#include "kiln/backend/dropout_mask.h"
#include "kiln/core/philox.h"

// The kernels need sm_80 (bf16 mma.sync, ldmatrix, cp.async): compiled for older targets their
// bodies are empty (the host never launches them there), which leaves helpers unreferenced.
// Without __CUDA_ARCH__ (nvcc's host pass, and the host compiler building tests/cuda_emulator) the
// bodies are kept.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define KILN_TENSOR_CORE_BODIES 0
#pragma nv_diag_suppress 177
#else
#define KILN_TENSOR_CORE_BODIES 1
#endif

namespace kiln::cuda::flash {

constexpr int kTileRows = 64;
constexpr int kThreads = 128;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr float kLog2E = 1.44269504088896341f;  // exp(x) = 2^(x log2 e)

template <int HS>
constexpr int kPitch = HS + 8;

// Where a block's (batch, head) = blockIdx.y slices start: in qkv [B, T, 3C], in the [B, T, C]
// tensors (out, dout, and dqkv's rows likewise at qkv_offset), in the [B, NH, T] statistics (lse,
// D) and in the [B, T] key mask.
struct Head {
  int64_t C, stride;  // stride: qkv's row, 3C
  int64_t qkv_offset, output_offset, statistics_offset, key_mask_offset;
  __device__ Head(int NH, int T_, int hs) {
    const int b = static_cast<int>(blockIdx.y) / NH, h = static_cast<int>(blockIdx.y) % NH;
    C = static_cast<int64_t>(NH) * hs;
    stride = 3 * C;
    qkv_offset = static_cast<int64_t>(b) * T_ * stride + h * hs;
    output_offset = static_cast<int64_t>(b) * T_ * C + h * hs;
    statistics_offset = static_cast<int64_t>(blockIdx.y) * T_;
    key_mask_offset = static_cast<int64_t>(b) * T_;
  }
};

// Queues this thread's part of the copy of min(rows, 64) rows of hs elements (`stride` apart; hs a
// multiple of 8, rows > 0) into `tile` by cp.async; rows past `rows` and columns past hs become
// zeros, so they add nothing to any product. The caller commits and waits (warp_matrix.cuh).
template <typename T, int HS>
__device__ __forceinline__ void copy_tile(T* tile, const T* source, int rows, int64_t stride,
                                          int hs) {
  constexpr int kChunksPerRow = HS / 8;  // 16 bytes each
  for (int chunk = static_cast<int>(threadIdx.x); chunk < kTileRows * kChunksPerRow;
       chunk += kThreads) {
    const int row = chunk / kChunksPerRow, column = chunk % kChunksPerRow * 8;
    const bool inside = row < rows && column < hs;
    copy_async_16(tile + row * kPitch<HS> + column,
                  inside ? source + row * stride + column : source, inside);
  }
}

// The A fragment (16 x 16) of rows [row0, row0 + 16), columns [16 step, 16 step + 16) of `tile`.
template <typename T, int HS>
__device__ __forceinline__ void load_row_fragment(uint32_t (&a)[4], const T* tile, int row0,
                                                  int step) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  load_matrices(a, tile + (row0 + lane % 16) * kPitch<HS> + step * 16 + lane / 16 * 8);
}

// acc [16 x 64] += A_step Y_step^T for k-step `step`: A's 16 x 16 fragment times columns
// [16 step, 16 step + 16) of the 64 rows Y of `tile` (B[k][n] = Y[n][k], which is ldmatrix's
// untransposed layout of Y's rows).
template <typename T, int HS>
__device__ __forceinline__ void add_step_by_rows_transposed(float (&acc)[kTileRows / 8][4],
                                                            const uint32_t (&a)[4], const T* tile,
                                                            int step) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int pair = 0; pair < kTileRows / 16; ++pair) {
    uint32_t b[4];  // b0, b1 of column tiles 2 pair and 2 pair + 1
    load_matrices(b, tile + (pair * 16 + lane % 8 + lane / 16 * 8) * kPitch<HS> + step * 16 +
                         lane / 8 % 2 * 8);
    const uint32_t first[2] = {b[0], b[1]}, second[2] = {b[2], b[3]};
    mma_16x8x16<T>(acc[2 * pair], a, first);
    mma_16x8x16<T>(acc[2 * pair + 1], a, second);
  }
}

// Zeros N m16n8 accumulators.
template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// acc [16 x 64] = A Y^T: A rows [row0, row0 + 16) of `a_tile`, read one k-step's fragment at a
// time (so that only one occupies registers), Y the 64 rows of `tile`.
template <typename T, int HS>
__device__ __forceinline__ void multiply_by_rows_transposed(float (&acc)[kTileRows / 8][4],
                                                            const T* a_tile, int row0,
                                                            const T* tile) {
  zero(acc);
#pragma unroll
  for (int step = 0; step < HS / 16; ++step) {
    uint32_t a[4];
    load_row_fragment<T, HS>(a, a_tile, row0, step);
    add_step_by_rows_transposed<T, HS>(acc, a, tile, step);
  }
}

// acc [16 x N] += A Y: A [16 x 64] as fragments (pack_fragments), Y columns [column0, column0 + N)
// of the [64 x HS] `tile` (B[k][n] = Y[k][column0 + n], ldmatrix's transposed layout of Y's rows);
// accumulate_step_by_rows adds one k-step's: A's columns and Y's rows [16 step, 16 step + 16).
template <typename T, int HS, int N = HS>
__device__ __forceinline__ void accumulate_step_by_rows(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                                        const T* tile, int step, int column0) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int pair = 0; pair < N / 16; ++pair) {
    uint32_t b[4];  // b0, b1 of output tiles 2 pair and 2 pair + 1
    load_matrices_transposed(b, tile + (step * 16 + lane % 8 + lane / 8 % 2 * 8) * kPitch<HS> + column0 +
                                    pair * 16 + lane / 16 * 8);
    const uint32_t first[2] = {b[0], b[1]}, second[2] = {b[2], b[3]};
    mma_16x8x16<T>(acc[2 * pair], a, first);
    mma_16x8x16<T>(acc[2 * pair + 1], a, second);
  }
}
template <typename T, int HS>
__device__ __forceinline__ void accumulate_by_rows(float (&acc)[HS / 8][4],
                                                   const uint32_t (&a)[kTileRows / 16][4], const T* tile) {
#pragma unroll
  for (int step = 0; step < kTileRows / 16; ++step) accumulate_step_by_rows<T, HS>(acc, a[step], tile, step, 0);
}

// The accumulators of a [16 x 64] product rounded to T as the A fragments of the next product over
// those 64 columns: column tiles 2s and 2s + 1 are k-step s, pair by pair (PTX ISA layouts).
template <typename T>
__device__ __forceinline__ void pack_fragments(uint32_t (&a)[kTileRows / 16][4],
                                               const float (&acc)[kTileRows / 8][4]) {
#pragma unroll
  for (int step = 0; step < kTileRows / 16; ++step) {
    a[step][0] = pack_pair<T>(acc[2 * step][0], acc[2 * step][1]);
    a[step][1] = pack_pair<T>(acc[2 * step][2], acc[2 * step][3]);
    a[step][2] = pack_pair<T>(acc[2 * step + 1][0], acc[2 * step + 1][1]);
    a[step][3] = pack_pair<T>(acc[2 * step + 1][2], acc[2 * step + 1][3]);
  }
}

// Visits this lane's elements of a warp's [16 x 64] accumulators as visit(element, row, column),
// row in [0, 16) and column in [0, 64) of the product.
template <typename Visit>
__device__ __forceinline__ void for_each_element(float (&acc)[kTileRows / 8][4], Visit visit) {
  // Unsigned, so that the compiler knows the lane lies in [0, 32) and folds a visitor's row < 8
  // (a run-time index into a per-row array would put the array on the stack).
  const int lane = static_cast<int>(threadIdx.x % 32u);
#pragma unroll
  for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      visit(acc[n][i], lane / 4 + i / 2 * 8, n * 8 + lane % 4 * 2 + i % 2);
}

// Whether some query of the 64 at q0 does not see some key of the 64 at k0 (k0 <= q0 when causal),
// so that the tile needs its mask: a key mask, keys past the sequence's end, the causal diagonal.
// Queries past the end are not counted: kernels whose rows are queries never store theirs.
__device__ __forceinline__ bool tile_hides_keys(bool key_mask, bool causal, int q0, int k0,
                                                int T_) {
  return key_mask || k0 + kTileRows > T_ || (causal && k0 + kTileRows - 1 > q0);
}

// Element i of accumulator tile n as pack_fragments rounded it into `a`.
template <typename T>
__device__ __forceinline__ float packed_element(const uint32_t (&a)[kTileRows / 16][4], int n,
                                                int i) {
  const uint32_t pair = a[n / 2][n % 2 * 2 + i / 2];
  using Raw = std::conditional_t<std::is_same_v<T, __half>, __half_raw, __nv_bfloat16_raw>;
  Raw raw;
  raw.x = static_cast<unsigned short>(pair >> (16 * (i % 2)));
  return to_float(T(raw));
}

// Visits this lane's pairs of a warp's [16 x 64] product as pack_fragments packed them, as
// visit(pair, row, column): row in [0, 16), column even (the pair's first).
template <typename Visit>
__device__ __forceinline__ void for_each_packed_pair(const uint32_t (&packed)[kTileRows / 16][4], Visit visit) {
  const int lane = static_cast<int>(threadIdx.x % 32u);
#pragma unroll
  for (int step = 0; step < kTileRows / 16; ++step)
#pragma unroll
    for (int i = 0; i < 4; ++i)  // column tile 2 step + i / 2, row g + 8 (i % 2)
      visit(packed[step][i], lane / 4 + i % 2 * 8, (2 * step + i / 2) * 8 + lane % 4 * 2);
}

// Visits this lane's pairs of a warp's [16 x N] accumulators that fall in rows row0 + g and
// row0 + g + 8 below `rows` and in columns column0 + [0, N) below hs, as visit(row, column, n, r):
// the pair is acc[n][2r], acc[n][2r + 1], at columns `column` and `column` + 1 (hs is a multiple
// of 8: both or neither).
template <int N, typename Visit>
__device__ __forceinline__ void for_each_stored_pair(int rows, int hs, int row0, int column0, Visit visit) {
  const int lane = static_cast<int>(threadIdx.x) % 32, group = lane / 4, in_group = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + group + r * 8;
    if (row >= rows) continue;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      const int column = column0 + n * 8 + 2 * in_group;
      if (column < hs) visit(row, column, n, r);
    }
  }
}

// Writes rows row0 + g and row0 + g + 8 (those below `rows`) of a warp's [16 x HS] accumulators,
// times `factor[0]` and `factor[1]`, to `out` (rows `stride` elements apart), columns below hs.
template <typename T, int HS>
__device__ __forceinline__ void store_rows(T* out, int64_t stride, int rows, int hs, int row0,
                                           const float (&acc)[HS / 8][4],
                                           const float (&factor)[2]) {
  for_each_stored_pair<HS>(rows, hs, row0, 0, [&](int row, int column, int n, int r) {
    *reinterpret_cast<uint32_t*>(out + row * stride + column) =
        pack_pair<T>(acc[n][2 * r] * factor[r], acc[n][2 * r + 1] * factor[r]);
  });
}

// sums[0] += low and sums[1] += high, each atomically (sums 8-byte aligned in global memory): one
// vector reduction on sm_90 and newer, two scalar ones before.
__device__ __forceinline__ void add_pair_atomically(float* sums, float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(sums), make_float2(low, high));
#else
  atomicAdd(sums, low);
  atomicAdd(sums + 1, high);
#endif
}

// Adds rows row0 + g and row0 + g + 8 (those below `rows`) of a warp's [16 x N] accumulators to the
// fp32 `sums` (rows `stride` floats apart) at columns [column0, column0 + N) below hs, atomically:
// blocks that add to the same rows may run at once (the order of their additions, and so the
// rounding of the sums, is not fixed).
template <int N>
__device__ __forceinline__ void add_rows_atomically(float* sums, int64_t stride, int rows, int hs, int row0,
                                                    int column0, const float (&acc)[N / 8][4]) {
  // sums and stride by value: captured by reference, ptxas spilled 56-76 bytes more in the mma.sync
  // head-128 key kernel.
  for_each_stored_pair<N>(rows, hs, row0, column0, [sums, stride, &acc](int row, int column, int n, int r) {
    add_pair_atomically(sums + row * stride + column, acc[n][2 * r], acc[n][2 * r + 1]);
  });
}

// The inverse of store_rows for fp32 rows: a warp's [16 x HS] accumulators from rows row0 + g and
// row0 + g + 8 of `rows_in` (rows `stride` floats apart), zeros for rows past `rows` and columns
// past hs.
template <int HS>
__device__ __forceinline__ void load_rows(float (&acc)[HS / 8][4], const float* rows_in, int64_t stride, int rows,
                                          int hs, int row0) {
  const int lane = static_cast<int>(threadIdx.x) % 32, group = lane / 4, in_group = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + group + r * 8;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      const int column = n * 8 + 2 * in_group;
      float2 pair = make_float2(0.0f, 0.0f);
      if (row < rows && column < hs) pair = *reinterpret_cast<const float2*>(rows_in + row * stride + column);
      acc[n][2 * r] = pair.x;
      acc[n][2 * r + 1] = pair.y;
    }
  }
}

// ---- attention dropout (ops.h, AttentionDropout) -----------------------------------------------
// Element (query, key) of the head whose [B, NH, T] statistics start at `head` (Head's
// statistics_offset, (b NH + h) T) is kept iff its bits, philox::bits of index (head + query) T +
// key, are at least the mask's threshold: DropoutMask::factor's rule, so the general kernels
// (general_attention.cu) and the CPU drop the same elements. A lane's keep bits of a warp's [16 x 64]
// product are one word, bit 4n + i for acc[n][i] (for_each_element's order), drawn by
// keep_by_query_rows (rows queries: forward, query kernel) or keep_by_key_rows (rows keys: key
// kernel). Uniform in the kernels: they draw only in their Dropout instances.

// Word `word` (0-3) of a Philox block, by selects: an indexed read of a register array would put the
// array on the stack.
__device__ __forceinline__ uint32_t philox_word(const philox::Words& block, uint32_t word) {
  return word == 0 ? block.w[0] : word == 1 ? block.w[1] : word == 2 ? block.w[2] : block.w[3];
}

// Bits 0 and 1: whether elements `index` and `index + 1` of the mask's stream are kept. One Philox
// block holds both (elements 4 b .. 4 b + 3 are block b's words) unless `index` is its last.
__device__ __forceinline__ uint32_t keep_pair(const DropoutMask& mask, uint64_t index) {
  const philox::Words block = philox::block(mask.seed, mask.stream, index >> 2);
  const uint32_t word = static_cast<uint32_t>(index & 3);
  const uint32_t first = philox_word(block, word);
  const uint32_t second =
      word < 3 ? philox_word(block, word + 1) : philox::block(mask.seed, mask.stream, (index >> 2) + 1).w[0];
  return static_cast<uint32_t>(first >= mask.threshold) | static_cast<uint32_t>(second >= mask.threshold) << 1;
}

// Rows queries [query0, query0 + 16) (this warp's), columns keys [k0, k0 + 64): a lane's column
// pairs are consecutive keys, consecutive elements, one block a pair (keep_pair; two where a pair
// straddles blocks, which needs T odd).
__device__ __forceinline__ uint32_t keep_by_query_rows(const DropoutMask& mask, int64_t head, int T_, int query0,
                                                       int k0) {
  const int lane = static_cast<int>(threadIdx.x % 32u);
  uint32_t keep = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // rows g and g + 8: elements 2 half and 2 half + 1
    const uint64_t first = static_cast<uint64_t>(head + query0 + lane / 4 + half * 8) * static_cast<uint64_t>(T_) +
                           static_cast<uint64_t>(k0 + lane % 4 * 2);
#pragma unroll
    for (int n = 0; n < kTileRows / 8; ++n) keep |= keep_pair(mask, first + 8 * n) << (4 * n + 2 * half);
  }
  return keep;
}

// Rows keys [key0, key0 + 16) (this warp's), columns queries [q0, q0 + 64). A lane's elements of
// one query (rows g and g + 8) are 8 apart, but the eight lanes of a column (lane % 4 alike, g =
// 0..7) hold the query's 16 consecutive keys, elements e0 .. e0 + 15 of at most five blocks: lane g
// draws block e0 / 4 + g (g < 5 needed) and hands its four keep bits to the lanes whose elements it
// holds by a shuffle. 16 blocks a lane per tile, for 32 elements.
__device__ __forceinline__ uint32_t keep_by_key_rows(const DropoutMask& mask, int64_t head, int T_, int key0, int q0) {
  const int lane = static_cast<int>(threadIdx.x % 32u), group = lane / 4, in_group = lane % 4;
  uint32_t keep = 0;
  // Not unrolled: with all 16 blocks' rounds in flight at once, ptxas (nvcc 13.0, sm_90a) spilled the
  // head-128 key kernels' registers.
#pragma unroll 1
  for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // query q0 + 8 n + 2 in_group + c: elements c and 2 + c
      const uint64_t e0 = static_cast<uint64_t>(head + q0 + 8 * n + 2 * in_group + c) * static_cast<uint64_t>(T_) +
                          static_cast<uint64_t>(key0);
      const philox::Words block = philox::block(mask.seed, mask.stream, (e0 >> 2) + static_cast<uint64_t>(group));
      uint32_t bits = 0;  // bit w: word w kept
#pragma unroll
      for (int w = 0; w < 4; ++w) bits |= static_cast<uint32_t>(block.w[w] >= mask.threshold) << w;
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // key key0 + g + 8 half: element e0 + g + 8 half
        const uint64_t e = e0 + static_cast<uint64_t>(group + 8 * half);
        const int from = static_cast<int>((e >> 2) - (e0 >> 2)) * 4 + in_group;
        const uint32_t drawn = __shfl_sync(kFullWarp, bits, from);
        keep |= (drawn >> (e & 3) & 1u) << (4 * n + 2 * half + c);
      }
    }
  return keep;
}

// Dropped elements of a warp's [16 x 64] accumulators (keep bit clear) become 0.
__device__ __forceinline__ void drop(float (&acc)[kTileRows / 8][4], uint32_t keep) {
#pragma unroll
  for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (!(keep >> (4 * n + i) & 1u)) acc[n][i] = 0.0f;
}

// The same on the accumulators as pack_fragments packed them: a[step][j] holds acc[2 step + j / 2]
// elements 2 (j % 2) and 2 (j % 2) + 1, keep bits 8 step + 2 j and the next, in its low and high
// halves.
__device__ __forceinline__ void drop_packed(uint32_t (&a)[kTileRows / 16][4], uint32_t keep) {
#pragma unroll
  for (int step = 0; step < kTileRows / 16; ++step)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t bits = keep >> (8 * step + 2 * j);
      a[step][j] &= ((bits & 1u) ? 0x0000ffffu : 0u) | ((bits & 2u) ? 0xffff0000u : 0u);
    }
}

// The products of the attention kernels on this file's tiles, as one interface that
// core_matrix_tiles.cuh also offers (the kernels take either as their Tiles parameter): tiles of
// kTile elements; copy() queues a tile's cp.async (copy_tile); landed() is what a thread does
// after its copies landed, or after its stores into a tile, and before the barrier that lets
// products read the tile; scores_from_tile() forms a warp's 16 rows of X Y^T (X the warp's rows
// of a tile), accumulate() adds P Y; start_scores_from_tile() and start_accumulate() may return
// before their products are done (kAsynchronous; here they are done), finish() waits for every
// product started, finish_all_but_newest() for all but the last start_*() call's. store_packed()
// writes a warp's rows of a packed [64 x 64] product into a score tile (kScoreTile elements),
// which multiply_transposed() reads transposed: a warp's 16 rows of S^T Y over a window of
// kTransposedColumns columns of a tile Y.
template <typename T, int HS>
struct PaddedTiles {
  static constexpr int kTile = kTileRows * kPitch<HS>;
  static __device__ void copy(T* tile, const T* source, int rows, int64_t stride, int hs) {
    copy_tile<T, HS>(tile, source, rows, stride, hs);
  }
  static __device__ void landed() {}
  // s = X Y^T for this warp's 16 rows X of tile `rows`, Y the 64 rows of `tile`.
  static __device__ void scores_from_tile(float (&s)[kTileRows / 8][4], const T* rows, const T* tile) {
    multiply_by_rows_transposed<T, HS>(s, rows, static_cast<int>(threadIdx.x) / 32 * 16, tile);
  }
  // o += P Y, Y the [64 x HS] `tile`.
  static __device__ void accumulate(float (&o)[HS / 8][4], const uint32_t (&p)[kTileRows / 16][4],
                                    const T* tile) {
    accumulate_by_rows<T, HS>(o, p, tile);
  }
  static __device__ void start_scores_from_tile(float (&s)[kTileRows / 8][4], const T* rows, const T* tile) {
    scores_from_tile(s, rows, tile);
  }
  static __device__ void start_accumulate(float (&o)[HS / 8][4], const uint32_t (&p)[kTileRows / 16][4],
                                          const T* tile) {
    accumulate(o, p, tile);
  }
  // Products are done when start_*() returns: issuing one early overlaps nothing and only lengthens
  // the life of its accumulators.
  static constexpr bool kAsynchronous = false;
  template <typename... Accumulators>
  static __device__ void finish(Accumulators&...) {}
  template <typename... Accumulators>
  static __device__ void finish_all_but_newest(Accumulators&...) {}

  static constexpr int kScoreTile = kTileRows * kPitch<kTileRows>;
  // The columns a multiply_transposed() takes at a time: at head 128 half of 64, since its caller
  // holds dK and dV too (ptxas, sm_80: 36 bytes spilled with 64, 4-8 with 32 or 16).
  static constexpr int kTransposedColumns = HS == 128 ? 32 : 64;
  // This warp's 16 rows of a [64 x 64] product, packed (pack_fragments), into `scores`.
  static __device__ void store_packed(T* scores, const uint32_t (&packed)[kTileRows / 16][4]) {
    T* const rows = scores + static_cast<int>(threadIdx.x) / 32 * 16 * kPitch<kTileRows>;
    for_each_packed_pair(packed, [&](uint32_t pair, int row, int column) {
      *reinterpret_cast<uint32_t*>(rows + row * kPitch<kTileRows> + column) = pair;
    });
  }
  // acc [16 x N] = S^T Y for this warp's 16 rows: S the [64 x 64] `scores` (its columns [16w,
  // 16w + 16) are this warp's rows), Y columns [column0, column0 + N) of `tile`.
  template <int N>
  static __device__ void multiply_transposed(float (&acc)[N / 8][4], const T* scores, const T* tile, int column0) {
    const int lane = static_cast<int>(threadIdx.x) % 32, row0 = static_cast<int>(threadIdx.x) / 32 * 16;
    zero(acc);
#pragma unroll
    for (int step = 0; step < kTileRows / 16; ++step) {  // S's rows [16 step, 16 step + 16), transposed
      uint32_t a[4];  // one k-step's fragment at a time: the head-128 key kernel is at the register limit
      load_matrices_transposed(a, scores + (step * 16 + lane / 16 * 8 + lane % 8) * kPitch<kTileRows> + row0 +
                                      lane / 8 % 2 * 8);
      accumulate_step_by_rows<T, HS, N>(acc, a, tile, step, column0);
    }
  }
};

// A kernel's shared memory in tiles of `Tiles` (PaddedTiles or CoreMatrixTiles): `Own` tiles it
// keeps for its whole loop, then two buffers of the pair of tiles it streams (one filled by
// cp.async while the other is read), then whatever else it needs from end() on.
template <typename T, typename Tiles, int Own>
struct SharedTiles {
  static constexpr int kTile = Tiles::kTile;
  static constexpr size_t kBytes = static_cast<size_t>(Own + 4) * kTile * sizeof(T);
  T* base;
  __device__ T* own(int i) const { return base + i * kTile; }
  __device__ T* first(int buffer) const { return base + (Own + 2 * buffer) * kTile; }
  __device__ T* second(int buffer) const { return first(buffer) + kTile; }
  __device__ void* end() const { return base + (Own + 4) * kTile; }
};

}  // namespace kiln::cuda::flash
