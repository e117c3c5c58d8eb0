// Fused attention forward on tensor cores (flash_attention.h) with every matrix fragment in
// registers: the FlashAttention-2 forward (Dao 2023, Algorithm 1). One block of four warps per
// (batch, head) and 64 queries; warp w owns queries [16w, 16w + 16). Per 64-key tile:
//   S = Q K^T (fp32 accumulators: this warp's 16 x 64 scores, 32 per lane);
//   online softmax on those registers: running maximum m and sum l per row (Milakov & Gimelshein
//   2018), in base 2 (exp(x) = 2^(x log2 e), the scale folded in), a row's four lanes combining
//   their maxima with two shuffles; O *= 2^(m_old - m_new);
//   O += P V, where P is the score accumulators rounded to 16 bits: the accumulator layout of an
//   m16n8 product is, pair by pair, the A-operand layout of the next m16n8k16 product (PTX ISA),
//   so P never leaves registers.
// At the end out = O / l and lse = (m + log2 l) ln 2 (natural log, for the backward kernels);
// with fp8 codes (flash_attention.h, AttentionCodes) out is also cast for c_proj's fp8 forward, in
// the tiles' shared memory (attention_tile_codes.cuh).
// Q, K and V tiles reach shared memory by cp.async; K and V are double-buffered, so the next
// tile's copy runs under this tile's products, with one __syncthreads per tile.
//
// The products come in two forms (the Tiles parameter), with the same register layouts:
//   PaddedTiles (sm_80+, flash_tiles.cuh): rows padded by 16 bytes, ldmatrix and mma.sync;
//   CoreMatrixTiles (sm_90a, core_matrix_tiles.cuh): wgmma reading K and V from shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kiln/backend/cuda/attention_tile_codes.cuh"
#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/core_matrix_tiles.cuh"
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

template <typename T, int HS, typename Tiles>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(T* out, float* lse, const T* qkv, const int32_t* key_mask, int NH, int T_,
                   int hs, bool causal, float scale, AttentionCodes codes) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const ForwardTiles<T, Tiles> tiles_at{reinterpret_cast<T*>(shared)};
  T* const q = tiles_at.own(0);
  const auto keys = [&](int buffer) { return tiles_at.first(buffer); };
  const auto values = [&](int buffer) { return tiles_at.second(buffer); };

  const Head head(NH, T_, hs);
  const int q0 = static_cast<int>(blockIdx.x) * kTileRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // The PTX fragment layouts' groupID and threadID_in_group (flash_tiles.cuh).
  const int group = lane / 4, in_group = lane % 4;
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
  // Rows `group` and `group + 8` of this warp's 16: maxima (base-2 units), and this lane's part of
  // the sums (its columns only: the four lanes of a row add theirs at the end).
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

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

    // Scale into base-2 units; keys a query does not see become -inf (only tiles that have any).
    const bool masked = tile_hides_keys(key_mask != nullptr, causal, q0, k0, T_);
    for_each_element(s, [&](float& score, int row, int column) {
      const bool seen = !masked || visible(q0 + warp * 16 + row, k0 + column);
      score = seen ? score * scale_log2 : -INFINITY;
    });

    // Online softmax; s becomes P = 2^(s - m_new).
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kTileRows / 8; ++n)
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row that sees no key yet keeps base 0: no -inf - -inf.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      rescale[r] = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[n][2 * r + c] = exp2f(s[n][2 * r + c] - base);
          tile_sum += s[n][2 * r + c];
        }
      row_sum[r] = row_sum[r] * rescale[r] + tile_sum;
    }
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }

    uint32_t p[kTileRows / 16][4];  // O += P V, P straight from the score accumulators
    pack_fragments<T>(p, s);
    Tiles::accumulate(o, p, values(tile % 2));
  }

  float inverse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(kFullWarp, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(kFullWarp, row_sum[r], 2);
    inverse[r] = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;  // a row that sees no key: zeros
  }
  store_rows<T, HS>(out + head.output_offset, C, T_, hs, q0 + warp * 16, o, inverse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q0 + warp * 16 + group + r * 8;
    if (in_group == 0 && query < T_)
      lse[head.statistics_offset + query] =
          row_sum[r] > 0.0f ? (row_max[r] + log2f(row_sum[r])) / kLog2E : -INFINITY;
  }
  if (codes.rows)  // the output cast too (attention_tile_codes.cuh)
    write_tile_codes<T, HS>(o, inverse, codes, NH, T_, hs, q0, 0, 1, reinterpret_cast<unsigned char*>(shared));
#endif
}

template <typename T, int HS, typename Tiles>
int forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int64_t B, int64_t seq,
            int64_t NH, int64_t hs, bool causal, float scale, const AttentionCodes& codes) {
  constexpr size_t bytes = ForwardTiles<T, Tiles>::kBytes;
  const auto kernel = forward_kernel<T, HS, Tiles>;
  if (const cudaError_t status =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))
    return static_cast<int>(status);
  const dim3 grid(static_cast<unsigned>((seq + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>(B * NH));
  launch(kernel, grid, kThreads, bytes, static_cast<T*>(out), lse, static_cast<const T*>(qkv),
         key_mask, static_cast<int>(NH), static_cast<int>(seq), static_cast<int>(hs), causal,
         scale, codes);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int HS>
int forward_on(bool warpgroup, void* out, float* lse, const void* qkv, const int32_t* key_mask,
               int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal, float scale,
               const AttentionCodes& codes) {
  return warpgroup ? forward<T, HS, CoreMatrixTiles<T, HS>>(out, lse, qkv, key_mask, B, seq, NH, hs,
                                                           causal, scale, codes)
                   : forward<T, HS, PaddedTiles<T, HS>>(out, lse, qkv, key_mask, B, seq, NH, hs,
                                                       causal, scale, codes);
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
                            float scale, bool warpgroup, const AttentionCodes* codes) {
  if (B * NH * T == 0) return 0;
  if (!tiled_attention_shape(kind, HS)) return static_cast<int>(cudaErrorInvalidValue);
  if (codes && (B * T % 16 != 0 || NH * HS % 16 != 0)) return static_cast<int>(cudaErrorInvalidValue);
  const AttentionCodes plain{};
  const auto run = [&](auto instance) {
    return instance(warpgroup, out, lse, qkv, key_mask, B, T, NH, HS, causal, scale, codes ? *codes : plain);
  };
  if (kind == kBf16)
    return HS <= 64 ? run(flash::forward_on<__nv_bfloat16, 64>)
                    : run(flash::forward_on<__nv_bfloat16, 128>);
  return HS <= 64 ? run(flash::forward_on<__half, 64>) : run(flash::forward_on<__half, 128>);
}

}  // namespace kiln::cuda
