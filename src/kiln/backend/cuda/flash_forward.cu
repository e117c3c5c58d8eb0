// Fused attention forward on tensor cores (flash_attention.h) with every matrix fragment in
// registers: the FlashAttention-2 forward (Dao 2023, Algorithm 1). One block of four warps per
// (batch, head) and 64 queries; warp w owns queries [16w, 16w + 16). (Two 64-query tiles a block
// at heads of 64, FlashAttention-2's 128-query tiles, measured slower on an H100: 0.67 ms against
// 0.58 at 64x1024, 12 heads of 64; bench/NOTES.md, 2026-11-26.) Per 64-key tile:
//   S = Q K^T (fp32 accumulators: this warp's 16 x 64 scores, 32 per lane);
//   online softmax on those registers: running maximum m and sum l per row (Milakov & Gimelshein
//   2018), in base 2 (exp(x) = 2^(x log2 e), the scale folded in), a row's four lanes combining
//   their maxima with two shuffles; O *= 2^(m_old - m_new);
//   O += P V, where P is the score accumulators rounded to 16 bits: the accumulator layout of an
//   m16n8 product is, pair by pair, the A-operand layout of the next m16n8k16 product (PTX ISA),
//   so P never leaves registers.
// At the end out = O / l and lse = (m + log2 l) ln 2 (natural log, for the backward kernels);
// with attention dropout (ops.h, AttentionDropout) P's dropped elements are zeroed after the
// softmax step, so that m and l stay those of the undropped P, and out = O / (l (1 - p)): O
// accumulates (P M) V with M the 0/1 keep mask, and Z = M / (1 - p) is uniform in its kept elements
// (the mask is drawn in registers: flash_tiles.cuh, keep_by_query_rows);
// with fp8 codes (flash_attention.h, AttentionCodes) out is also cast for c_proj's fp8 forward, in
// the tiles' shared memory (attention_tile_codes.cuh).
// Q, K and V tiles reach shared memory by cp.async; K and V are double-buffered, so the next
// tile's copy runs under this tile's products, with one __syncthreads per tile.
//
// Two kernels, with the same register layouts and the same softmax:
//   forward_kernel, on PaddedTiles (sm_80+, flash_tiles.cuh): rows padded by 16 bytes, ldmatrix
//     and mma.sync, whose products are done when they return;
//   overlapped_forward_kernel, on CoreMatrixTiles (sm_90a, core_matrix_tiles.cuh): wgmma, whose
//     products run asynchronously, so that each tile's S = Q K^T is issued together with the
//     previous tile's O += P V and the softmax runs while the tensor cores finish that product
//     (FlashAttention-3's overlap within a warpgroup: Shah et al. 2024, section 3.2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kiln/backend/cuda/attention_tile_codes.cuh"
#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/core_matrix_tiles.cuh"
#include "kiln/backend/cuda/fast_exp2.cuh"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/flash_tiles.cuh"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch.cuh"

namespace kiln::cuda {
namespace flash {
namespace {

// Q, then K and V twice.
template <typename T, typename Tiles>
using ForwardTiles = SharedTiles<T, Tiles, 1>;
template <int HS>
constexpr bool kCodesFitInTiles =
    ForwardTiles<__half, PaddedTiles<__half, HS>>::kBytes >= kTileCodesSharedBytes<__half, HS> &&
    ForwardTiles<__half, CoreMatrixTiles<__half, HS>>::kBytes >= kTileCodesSharedBytes<__half, HS>;
static_assert(kCodesFitInTiles<64> && kCodesFitInTiles<128>, "the output's codes stage in the tiles' memory");

// The online softmax of a warp's 16 rows of a query tile across key tiles, for this lane's two rows
// (group and group + 8 of the PTX layouts, flash_tiles.cuh): running maxima (base-2 units, the
// scale folded in) and this lane's part of the sums (its columns only: the four lanes of a row add
// theirs at the end).
struct OnlineSoftmax {
  float max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};

  // One key tile: s (unscaled scores, keys a query does not see already -inf) becomes
  // P = 2^(s scale_log2 - m_new); rescale[half] = 2^(m_old - m_new) is what O's rows must be
  // multiplied by before P V is added. scale_log2 > 0 (scale > 0, flash_attention.h): a row's
  // maximum is the unscaled one times scale_log2, and each exponent is one multiply-add.
  __device__ __forceinline__ void step(float (&s)[kTileRows / 8][4], float scale_log2, float (&rescale)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kTileRows / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
      const float new_max = fmaxf(max[half], tile_max * scale_log2);
      // A row that sees no key yet keeps base 0: no -inf - -inf.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      rescale[half] = exp2_flushed(max[half] - base);
      max[half] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[n][2 * half + c] = exp2_flushed(fmaf(s[n][2 * half + c], scale_log2, -base));
          tile_sum += s[n][2 * half + c];
        }
      sum[half] = sum[half] * rescale[half] + tile_sum;
    }
  }
};

// Scores of keys a query does not see become -inf, in a tile that has any (`masked`); query0 and k0
// are the first query of the warp's 16 rows and the tile's first key.
__device__ __forceinline__ void hide_unseen_keys(float (&s)[kTileRows / 8][4], bool masked, const Visibility& visible,
                                                 int query0, int k0) {
  for_each_element(s, [&](float& score, int row, int column) {
    if (masked && !visible(query0 + row, k0 + column)) score = -INFINITY;
  });
}

template <int HS>
__device__ __forceinline__ void rescale_rows(float (&o)[HS / 8][4], const float (&rescale)[2]) {
#pragma unroll
  for (int n = 0; n < HS / 8; ++n) {
    o[n][0] *= rescale[0];
    o[n][1] *= rescale[0];
    o[n][2] *= rescale[1];
    o[n][3] *= rescale[1];
  }
}

// After the last key tile: out = O kept_scale / l (kept_scale: dropout's 1 / (1 - p), else 1) and
// lse for the block's queries [q0, q0 + 64), then, with codes, out's codes in `shared` (the tiles'
// memory: every warp must be done reading its tiles).
template <typename T, int HS>
__device__ void write_outputs(const float (&o)[HS / 8][4], OnlineSoftmax& softmax, int q0, const Head& head, T* out,
                              float* lse, int T_, int hs, int NH, const AttentionCodes& codes,
                              unsigned char* shared, float kept_scale) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4, in_group = lane % 4;
  float inverse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float& sum = softmax.sum[half];
    sum += __shfl_xor_sync(kFullWarp, sum, 1);
    sum += __shfl_xor_sync(kFullWarp, sum, 2);
    inverse[half] = sum > 0.0f ? kept_scale / sum : 0.0f;  // a row that sees no key: zeros
  }
  store_rows<T, HS>(out + head.output_offset, head.C, T_, hs, q0 + warp * 16, o, inverse);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = q0 + warp * 16 + group + half * 8;
    const float sum = softmax.sum[half];
    if (in_group == 0 && query < T_)
      lse[head.statistics_offset + query] = sum > 0.0f ? (softmax.max[half] + log2f(sum)) / kLog2E : -INFINITY;
  }
  if (codes.rows)  // the output cast too (attention_tile_codes.cuh)
    write_tile_codes<T, HS>(o, inverse, codes, NH, T_, hs, q0, 0, 1, shared);
}

// Dropout: the instance that applies `dropout` (its threshold not 0); the other ignores it.
template <typename T, int HS, bool Dropout>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(T* out, float* lse, const T* qkv, const int32_t* key_mask, int NH, int T_,
                   int hs, bool causal, float scale, AttentionCodes codes, DropoutMask dropout) {
#if KILN_TENSOR_CORE_BODIES
  using Tiles = PaddedTiles<T, HS>;
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const ForwardTiles<T, Tiles> tiles_at{reinterpret_cast<T*>(shared)};
  T* const q = tiles_at.own(0);
  const auto keys = [&](int buffer) { return tiles_at.first(buffer); };
  const auto values = [&](int buffer) { return tiles_at.second(buffer); };

  const Head head(NH, T_, hs);
  const int q0 = static_cast<int>(blockIdx.x) * kTileRows;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t C = head.C, stride = head.stride;
  const T* sequence = qkv + head.qkv_offset;
  const Visibility visible{T_, causal, key_mask ? key_mask + head.key_mask_offset : nullptr};
  const float scale_log2 = scale * kLog2E;

  const int key_end = causal ? min(T_, q0 + kTileRows) : T_;
  const int tiles = (key_end + kTileRows - 1) / kTileRows;
  Tiles::copy(q, sequence + static_cast<int64_t>(q0) * stride, T_ - q0, stride, hs);
  Tiles::copy(keys(0), sequence + C, T_, stride, hs);
  Tiles::copy(values(0), sequence + 2 * C, T_, stride, hs);
  copy_commit();

  float o[HS / 8][4];
  zero(o);
  OnlineSoftmax softmax;

  for (int tile = 0; tile < tiles; ++tile) {
    const int k0 = tile * kTileRows;
    // This tile (and Q) has landed for every thread, and no warp still reads the other buffer.
    copy_wait<0>();
    Tiles::landed();
    __syncthreads();
    if (tile + 1 < tiles) {
      const int64_t next = static_cast<int64_t>(k0 + kTileRows) * stride;
      Tiles::copy(keys((tile + 1) % 2), sequence + C + next, T_ - k0 - kTileRows, stride, hs);
      Tiles::copy(values((tile + 1) % 2), sequence + 2 * C + next, T_ - k0 - kTileRows, stride, hs);
      copy_commit();
    }

    // S = Q K^T, Q's A operand read from its tile for every key tile. Held in registers across key
    // tiles instead, on the H100 (wgmma, nvcc 13.0) every product after the first key tile came out
    // wrong at head 64 (normalised error 0.35 at T = 150 against 0.0024 on mma.sync), although each
    // product alone is exact (bench/NOTES.md, 2026-11-25): the operand is not kept across the loop.
    float s[kTileRows / 8][4];
    Tiles::scores_from_tile(s, q, keys(tile % 2));
    hide_unseen_keys(s, tile_hides_keys(key_mask != nullptr, causal, q0, k0, T_), visible, q0 + warp * 16, k0);
    float rescale[2];
    softmax.step(s, scale_log2, rescale);
    if constexpr (Dropout) drop(s, keep_by_query_rows(dropout, head.statistics_offset, T_, q0 + warp * 16, k0));
    rescale_rows<HS>(o, rescale);
    uint32_t p[kTileRows / 16][4];  // O += P V, P straight from the score accumulators
    pack_fragments<T>(p, s);
    Tiles::accumulate(o, p, values(tile % 2));
  }
  write_outputs<T, HS>(o, softmax, q0, head, out, lse, T_, hs, NH, codes, reinterpret_cast<unsigned char*>(shared),
                       Dropout ? dropout.scale : 1.0f);
#endif
}

// The wgmma forward (one query tile a block, the block one warpgroup), overlapping each tile's
// products with the softmax. Per key tile j, after its K (and tile j - 1's V) landed:
//   issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1} (two commit groups);
//   wait for S_j alone; mask and softmax it into P_j (other registers than P_{j-1}, which the
//   tensor cores may still be reading);
//   wait for O += P_{j-1} V_{j-1}; O *= 2^(m_{j-1} - m_j).
// After the last tile, O += P V for it. V_j is needed one tile after K_j, so it arrives then: at the
// top of iteration j the block copies K_{j+1} into the K buffer S_{j-1} read, and V_j into the V
// buffer O += P_{j-2} V_{j-2} read, both done by then (waited for before the barrier), so the
// buffers are the forward_kernel's four. ptxas (nvcc 13.0, -Xptxas -v) reports no serialised wgmma
// for this kernel (cuda_build:attention_kernels_neither_spill_nor_serialise); the two shapes that
// made it serialise every one are noted where they arose.
// With Dropout, P_j's dropped elements are zeroed as forward_kernel's, while O += P_{j-1} V_{j-1}
// runs (in `probabilities`).
template <typename T, int HS, bool Dropout>
__global__ void __launch_bounds__(kThreads)
    overlapped_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* key_mask, int NH, int T_, int hs,
                              bool causal, float scale, AttentionCodes codes, DropoutMask dropout) {
#if KILN_TENSOR_CORE_BODIES
  using Tiles = CoreMatrixTiles<T, HS>;
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const ForwardTiles<T, Tiles> tiles_at{reinterpret_cast<T*>(shared)};
  T* const q = tiles_at.own(0);
  const auto keys = [&](int buffer) { return tiles_at.first(buffer); };
  const auto values = [&](int buffer) { return tiles_at.second(buffer); };

  const Head head(NH, T_, hs);
  const int q0 = static_cast<int>(blockIdx.x) * kTileRows;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t C = head.C, stride = head.stride;
  const T* sequence = qkv + head.qkv_offset;
  const Visibility visible{T_, causal, key_mask ? key_mask + head.key_mask_offset : nullptr};
  const float scale_log2 = scale * kLog2E;
  const int key_end = causal ? min(T_, q0 + kTileRows) : T_;
  const int tiles = (key_end + kTileRows - 1) / kTileRows;
  // Rows of key tile j of K (part 1) or V (part 2) into `tile`.
  const auto copy_key_rows = [&](T* tile, int j, int part) {
    Tiles::copy(tile, sequence + part * C + static_cast<int64_t>(j) * kTileRows * stride, T_ - j * kTileRows, stride,
                hs);
  };
  Tiles::copy(q, sequence + static_cast<int64_t>(q0) * stride, T_ - q0, stride, hs);
  copy_key_rows(keys(0), 0, 1);
  copy_commit();

  float o[HS / 8][4];
  zero(o);
  OnlineSoftmax softmax;
  // Waits for K_j and V_{j-1}, then queues the copies of K_{j+1} and V_j.
  const auto arrive = [&](int tile) {
    copy_wait<0>();
    Tiles::landed();
    __syncthreads();  // ... landed for every thread; no warp still reads K_{j-1} or V_{j-2}
    if (tile + 1 < tiles) copy_key_rows(keys((tile + 1) % 2), tile + 1, 1);
    copy_key_rows(values(tile % 2), tile, 2);
    copy_commit();
  };
  // Tile j's scores s through the mask and the softmax step into p_j (rescale: for O, as step's).
  const auto probabilities = [&](float(&s)[kTileRows / 8][4], int tile, uint32_t(&p_j)[kTileRows / 16][4],
                                 float(&rescale)[2]) {
    const int k0 = tile * kTileRows;
    hide_unseen_keys(s, tile_hides_keys(key_mask != nullptr, causal, q0, k0, T_), visible, q0 + warp * 16, k0);
    softmax.step(s, scale_log2, rescale);
    if constexpr (Dropout) drop(s, keep_by_query_rows(dropout, head.statistics_offset, T_, q0 + warp * 16, k0));
    pack_fragments<T>(p_j, s);
  };
  // P of the tiles, alternately in two sets of registers (tile j's in p[j % 2]): tile j's is written
  // while the product of tile j - 1's is in flight, reading its registers. (With one set, P_j
  // written into a second and copied over after the wait, ptxas serialised every wgmma: C7513,
  // "non wgmma instructions defining input registers of a wgmma" inside the pipeline stage.)
  uint32_t p[2][kTileRows / 16][4];
  {  // The first tile, with no P V before it. Peeled, so that every iteration below has the same
     // two products in flight: with the first in the loop, ptxas serialised every wgmma (C7514,
     // "non wgmma instructions reading accumulator registers of a wgmma").
    arrive(0);
    float s[kTileRows / 8][4], rescale[2];
    Tiles::scores_from_tile(s, q, keys(0));
    probabilities(s, 0, p[0], rescale);  // O is still zeros: nothing to rescale
  }
  const auto overlapped = [&](int tile, const uint32_t(&previous)[kTileRows / 16][4],
                              uint32_t(&current)[kTileRows / 16][4]) {
    arrive(tile);
    float s[kTileRows / 8][4], rescale[2];
    Tiles::start_scores_from_tile(s, q, keys(tile % 2));
    Tiles::start_accumulate(o, previous, values((tile - 1) % 2));
    Tiles::finish_all_but_newest(s);
    probabilities(s, tile, current, rescale);
    Tiles::finish(o);
    rescale_rows<HS>(o, rescale);
  };
  int tile = 1;
  for (; tile + 1 < tiles; tile += 2) {
    overlapped(tile, p[0], p[1]);
    overlapped(tile + 1, p[1], p[0]);
  }
  if (tile < tiles) overlapped(tile, p[0], p[1]);
  copy_wait<0>();  // the last tile's V
  Tiles::landed();
  __syncthreads();
  if ((tiles - 1) % 2 == 0)  // constant indices: the registers stay registers
    Tiles::accumulate(o, p[0], values((tiles - 1) % 2));
  else
    Tiles::accumulate(o, p[1], values((tiles - 1) % 2));
  write_outputs<T, HS>(o, softmax, q0, head, out, lse, T_, hs, NH, codes, reinterpret_cast<unsigned char*>(shared),
                       Dropout ? dropout.scale : 1.0f);
#endif
}

// The kernel of these tiles, with or without dropout's code.
template <typename T, int HS, typename Tiles, bool Dropout>
auto forward_kernel_of() {
  if constexpr (std::is_same_v<Tiles, CoreMatrixTiles<T, HS>>)
    return overlapped_forward_kernel<T, HS, Dropout>;
  else
    return forward_kernel<T, HS, Dropout>;
}

template <typename T, int HS, typename Tiles>
int forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int64_t B, int64_t seq,
            int64_t NH, int64_t hs, bool causal, float scale, const AttentionCodes& codes,
            const DropoutMask& dropout) {
  constexpr size_t bytes = ForwardTiles<T, Tiles>::kBytes;
  const auto kernel = dropout.threshold ? forward_kernel_of<T, HS, Tiles, true>()
                                        : forward_kernel_of<T, HS, Tiles, false>();
  if (const cudaError_t status =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))
    return static_cast<int>(status);
  const dim3 grid(static_cast<unsigned>((seq + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>(B * NH));
  launch(kernel, grid, kThreads, bytes, static_cast<T*>(out), lse, static_cast<const T*>(qkv),
         key_mask, static_cast<int>(NH), static_cast<int>(seq), static_cast<int>(hs), causal,
         scale, codes, dropout);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int HS>
int forward_on(bool warpgroup, void* out, float* lse, const void* qkv, const int32_t* key_mask,
               int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal, float scale,
               const AttentionCodes& codes, const DropoutMask& dropout) {
  return warpgroup ? forward<T, HS, CoreMatrixTiles<T, HS>>(out, lse, qkv, key_mask, B, seq, NH, hs,
                                                           causal, scale, codes, dropout)
                   : forward<T, HS, PaddedTiles<T, HS>>(out, lse, qkv, key_mask, B, seq, NH, hs,
                                                       causal, scale, codes, dropout);
}

}  // namespace
}  // namespace flash

bool warpgroup_attention_applies(int compute_major, int compute_minor) {
#if defined(KILN_CUDA_WGMMA)
  return compute_major == 9 && compute_minor == 0;
#else
  (void)compute_major, (void)compute_minor;
  return false;
#endif
}

// The (storage type, tile width) instantiations: the narrowest tile that holds the head.
int flash_attention_forward(void* out, float* lse, const void* qkv, const int32_t* key_mask,
                            int kind, int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal,
                            float scale, bool warpgroup, const AttentionCodes* codes, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  if (!tiled_attention_shape(kind, HS)) return static_cast<int>(cudaErrorInvalidValue);
  if (codes && (B * T % 16 != 0 || NH * HS % 16 != 0)) return static_cast<int>(cudaErrorInvalidValue);
  const AttentionCodes plain{};
  const auto run = [&](auto instance) {
    return instance(warpgroup, out, lse, qkv, key_mask, B, T, NH, HS, causal, scale, codes ? *codes : plain,
                    dropout);
  };
  if (kind == kBf16)
    return HS <= 64 ? run(flash::forward_on<__nv_bfloat16, 64>)
                    : run(flash::forward_on<__nv_bfloat16, 128>);
  return HS <= 64 ? run(flash::forward_on<__half, 64>) : run(flash::forward_on<__half, 128>);
}

}  // namespace kiln::cuda
