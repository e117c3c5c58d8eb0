// Fused attention backward on tensor cores (flash_attention.h; the forward is flash_forward.cu),
// with every product's fragments in registers (mma.sync, flash_tiles.cuh; on Hopper wgmma,
// core_matrix_tiles.cuh, which reads a block's own tiles from shared memory instead). D = rowsum(dout * out)
// first (general_attention.h), then, deterministic (the default), two kernels (Dao 2023 Algorithm
// 2, split so that no two blocks write one gradient row: no atomics, 7 products per pair of tiles),
// or else one kernel that also adds dQ (5 products per pair, Algorithm 2 as written). All recompute
// P = exp(s - lse) from the saved log-sum-exp, in base 2 with the scale folded in, and round P to
// 16 bits as the forward's P V product did.
//
// Key kernel, one block per 64 keys, warp w owning keys [16w, 16w + 16), looping over the query
// tiles that see them: S^T = K Q^T, P^T, dV += P^T dO; dP^T = V dO^T, dS^T = P^T (dP^T - D) scale,
// dK += dS^T Q. With the warp's rows being keys, P^T and dS^T come out of their products in the
// accumulator layout that is the A operand of the next product, so neither leaves registers; the
// per-query lse and D are read from shared memory by column.
// Query kernel, one block per 64 queries, warp w owning queries [16w, 16w + 16), looping over the
// key tiles they see: S = Q K^T, P, dP = dO V^T, dS = P (dP - D) scale, dQ += dS K.
// Not deterministic: the key kernel also writes each pair's dS^T into shared memory and forms
// dQ_tile = dS K from it (dS read transposed: ldmatrix.trans, or wgmma's M-major A), added into fp32
// sums [B*T, C] with atomic adds (so the order, and the sums' rounding, varies from run to run);
// the sums are zeroed before and rounded into dqkv after (query_gradient_from_sums_kernel). This
// saves the query kernel's two products and exponentials per pair (its S and dP again) for a pass
// over the sums: zeroed, added to in L2, read once.
// The tiles a kernel streams (Q and dO, or K and V) are double-buffered by cp.async, with one
// __syncthreads per tile; its own tiles stay in shared memory and their A fragments are read from
// there per product, which keeps the head-128 kernels within the register file.
// With fp8 codes (flash_attention.h, AttentionCodes) each kernel ends by writing its
// gradient tiles only as codes (attention_tile_codes.cuh), in the tiles' shared memory.
// With attention dropout (ops.h, AttentionDropout; the kernels' Dropout instances), as FlashAttention
// applies it (Dao et al. 2022, Algorithm 4): with Z = M / (1 - p), M the 0/1 keep mask drawn again in
// registers (flash_tiles.cuh), dV = (P Z)^T dO and dS = P (dP Z - D) scale, D = rowsum(dO out) with
// out the dropped forward's. The key kernel adds dV += (P^T M) dO, P^T with its dropped elements
// zeroed (a copy on mma.sync; on wgmma in place, after dS^T took P^T whole), and scales dV by
// 1 / (1 - p) once at the end; dP^T Z and dP Z are one multiply-add with the factor (0 or
// scale / (1 - p)) in place of scale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/cuda/attention_tile_codes.cuh"
#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/core_matrix_tiles.cuh"
#include "kiln/backend/cuda/fast_exp2.cuh"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/flash_tiles.cuh"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch.cuh"

namespace kiln::cuda {
namespace flash {
namespace {

// The key kernel keeps K and V and streams Q and dO, then stages the per-query lse and D of both
// buffers after the tiles; the query kernel keeps Q and dO and streams K and V.
template <typename T, typename Tiles>
using BackwardTiles = SharedTiles<T, Tiles, 2>;

// The key kernel that adds dQ also keeps a score tile for dS^T after the statistics.
template <typename T, typename Tiles, bool AddsQueryGradient = false>
constexpr size_t backward_shared_bytes() {
  return BackwardTiles<T, Tiles>::kBytes + 4 * kTileRows * sizeof(float) +
         (AddsQueryGradient ? Tiles::kScoreTile * sizeof(T) : 0);
}
static_assert(kTileRows == kAttentionGradientTileRows);  // the column sums' partial rows
// The key kernel's two tiles of codes (dk, dv) fit in its tiles' memory, as does the query kernel's one.
template <int HS>
constexpr bool kCodesFitInTiles =
    BackwardTiles<__half, PaddedTiles<__half, HS>>::kBytes >= 2 * kTileCodesSharedBytes<__half, HS> &&
    BackwardTiles<__half, CoreMatrixTiles<__half, HS>>::kBytes >= 2 * kTileCodesSharedBytes<__half, HS>;
static_assert(kCodesFitInTiles<64> && kCodesFitInTiles<128>);

// At head 64, ptxas left to itself aims at three blocks per SM and spills; two blocks is what its
// registers allow anyway (about 170 a thread), so it is told two. At head 128 (0: no minimum) its
// own choice has no spills; a minimum there made it spill.
// With AddsQueryGradient the kernel also adds each pair's dS K into dq_sums (dqkv's q part is left
// to query_gradient_from_sums_kernel); else dq_sums is unused.
// Dropout: the instance that applies `dropout` (its threshold not 0); the other ignores it.
template <typename T, int HS, typename Tiles, bool AddsQueryGradient, bool Dropout>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 2 : 0)
    key_gradients_kernel(T* dqkv, [[maybe_unused]] float* dq_sums, const T* dout, const T* qkv, const float* lse,
                         const float* row_dots, const int32_t* key_mask, int NH, int T_, int hs,
                         bool causal, float scale, AttentionCodes codes, DropoutMask dropout) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const BackwardTiles<T, Tiles> tiles_at{reinterpret_cast<T*>(shared)};
  T* const k = tiles_at.own(0);
  T* const v = tiles_at.own(1);
  const auto queries = [&](int buffer) { return tiles_at.first(buffer); };
  const auto gradients = [&](int buffer) { return tiles_at.second(buffer); };
  // Per buffer: the tile's 64 lse values (base-2 units), then its 64 D values.
  float* const statistics = static_cast<float*>(tiles_at.end());
  [[maybe_unused]] T* const score_gradients = reinterpret_cast<T*>(statistics + 4 * kTileRows);  // dS^T

  // dP^T issued with S^T, to run under P^T's exponentials: where products are asynchronous (on
  // mma.sync it would only hold dp's registers longer), at head 64 (at 128, with dK and dV taking
  // 128 registers, ptxas had to inject warpgroup fences to fit it: C7519).
  constexpr bool kEarlyScoreGradients = Tiles::kAsynchronous && HS == 64;
  const Head head(NH, T_, hs);
  const int k0 = static_cast<int>(blockIdx.x) * kTileRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int in_group = lane % 4;
  const T* sequence = qkv + head.qkv_offset;
  const T* gradient = dout + head.output_offset;
  [[maybe_unused]] float* const dq_rows = AddsQueryGradient ? dq_sums + head.output_offset : nullptr;
  const Visibility visible{T_, causal, key_mask ? key_mask + head.key_mask_offset : nullptr};
  const float scale_log2 = scale * kLog2E;
  [[maybe_unused]] const float kept_scale = scale * dropout.scale;  // dP^T's factor where kept
  // dV's scale at the end: 1 / (1 - p) with dropout (dV accumulates (P^T M) dO).
  const float dv_scale = Dropout ? dropout.scale : 1.0f;
  // Thread i < 64 stages lse of query q0 + i (in base-2 units), thread 64 + i its D times scale
  // (dS^T below is then P^T (dP^T scale - D scale), one multiply-add and a multiply an element).
  const bool stages_lse = threadIdx.x < kTileRows;
  const float* staged = (stages_lse ? lse : row_dots) + head.statistics_offset;
  const float staged_scale = stages_lse ? kLog2E : scale;
  const auto statistic = [&](int q0) {
    const int query = q0 + static_cast<int>(threadIdx.x) % kTileRows;
    return query < T_ ? staged[query] * staged_scale : 0.0f;
  };

  const int first_query = causal ? k0 : 0;  // earlier queries see none of these keys
  const int tiles = (T_ - first_query + kTileRows - 1) / kTileRows;
  Tiles::copy(k, sequence + head.C + static_cast<int64_t>(k0) * head.stride, T_ - k0, head.stride, hs);
  Tiles::copy(v, sequence + 2 * head.C + static_cast<int64_t>(k0) * head.stride, T_ - k0, head.stride, hs);
  Tiles::copy(queries(0), sequence + static_cast<int64_t>(first_query) * head.stride, T_ - first_query,
              head.stride, hs);
  Tiles::copy(gradients(0), gradient + static_cast<int64_t>(first_query) * head.C, T_ - first_query, head.C,
              hs);
  copy_commit();
  statistics[threadIdx.x] = statistic(first_query);

  float dk[HS / 8][4], dv[HS / 8][4];
  zero(dk);
  zero(dv);

  for (int tile = 0; tile < tiles; ++tile) {
    const int q0 = first_query + tile * kTileRows, buffer = tile % 2;
    copy_wait<0>();
    Tiles::landed();
    __syncthreads();  // this tile landed for every thread; no warp still reads the other buffer
    float next_statistic = 0.0f;
    if (tile + 1 < tiles) {
      const int next = q0 + kTileRows;
      Tiles::copy(queries(1 - buffer), sequence + static_cast<int64_t>(next) * head.stride, T_ - next,
                  head.stride, hs);
      Tiles::copy(gradients(1 - buffer), gradient + static_cast<int64_t>(next) * head.C, T_ - next, head.C,
                  hs);
      copy_commit();
      next_statistic = statistic(next);  // stored once this tile's products are issued
    }
    const float* tile_lse = statistics + buffer * 2 * kTileRows;
    const float* tile_dots = tile_lse + kTileRows;
    // The tile's keep bits, drawn before its products, where only dK and dV hold registers (drawn
    // under dP^T's product instead, ptxas (nvcc 13.0, sm_90a) spilled 76-144 bytes at head 128).
    [[maybe_unused]] uint32_t keep = 0;
    if constexpr (Dropout) keep = keep_by_key_rows(dropout, head.statistics_offset, T_, k0 + warp * 16, q0);

    float s[kTileRows / 8][4], dp[kTileRows / 8][4];  // S^T = K Q^T: rows keys, columns this tile's queries
    Tiles::start_scores_from_tile(s, k, queries(buffer));
    if constexpr (kEarlyScoreGradients) {  // dP^T = V dO^T on the tensor cores under P^T's exponentials
      Tiles::start_scores_from_tile(dp, v, gradients(buffer));
      Tiles::finish_all_but_newest(s);
    } else {
      Tiles::finish(s);
    }
    // Query columns past the sequence's end need no mask: their Q and dO rows are zeros and their
    // lse and D are staged as 0, so P^T = 1 and dS^T = 0 there, finite values that meet only the
    // zero rows of dO and Q.
    const bool masked = tile_hides_keys(key_mask != nullptr, causal, q0, k0, T_);
    for_each_element(s, [&](float& score, int row, int column) {  // P^T
      const float row_lse = tile_lse[column];
      const bool seen =
          !masked || (visible(q0 + column, k0 + warp * 16 + row) && row_lse != -INFINITY);
      score = seen ? exp2_flushed(fmaf(score, scale_log2, -row_lse)) : 0.0f;
    });
    uint32_t p[kTileRows / 16][4];
    pack_fragments<T>(p, s);
    // With dropout P^T is needed whole for dS^T and dropped (P^T M) for dV. Products done when they
    // return (mma.sync): dV's first from a dropped copy, then dP^T (as without dropout, no more
    // registers at once than its two products'); asynchronous: dP^T alone, dV's after dS^T from P^T
    // dropped in place (a copy in flight with both would hold 16 registers more).
    constexpr bool kDropsAfterScoreGradients = Dropout && Tiles::kAsynchronous;
    if constexpr (Dropout && !kDropsAfterScoreGradients) {
      uint32_t kept[kTileRows / 16][4];
#pragma unroll
      for (int step = 0; step < kTileRows / 16; ++step)
#pragma unroll
        for (int j = 0; j < 4; ++j) kept[step][j] = p[step][j];
      drop_packed(kept, keep);
      Tiles::start_accumulate(dv, kept, gradients(buffer));
      Tiles::start_scores_from_tile(dp, v, gradients(buffer));
      Tiles::finish(dv, dp);
    } else if constexpr (kDropsAfterScoreGradients) {
      if constexpr (!kEarlyScoreGradients) Tiles::start_scores_from_tile(dp, v, gradients(buffer));
      Tiles::finish(dp);
    } else {
      // dV += P^T dO and dP^T = V dO^T, independent products, in flight together (dP^T since S^T when
      // kEarlyScoreGradients).
      Tiles::start_accumulate(dv, p, gradients(buffer));
      if constexpr (!kEarlyScoreGradients) Tiles::start_scores_from_tile(dp, v, gradients(buffer));
      Tiles::finish(dv, dp);
    }
#pragma unroll
    for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // dS^T (with dropout dP^T Z: the factor 0 or scale / (1 - p) for scale)
        const float factor = !Dropout ? scale : (keep >> (4 * n + i) & 1u) ? kept_scale : 0.0f;
        dp[n][i] = packed_element<T>(p, n, i) * fmaf(dp[n][i], factor, -tile_dots[n * 8 + 2 * in_group + i % 2]);
      }
    uint32_t ds[kTileRows / 16][4];
    pack_fragments<T>(ds, dp);
    if constexpr (kDropsAfterScoreGradients) {  // dV += (P^T M) dO, in flight with dK's product below
      drop_packed(p, keep);
      Tiles::start_accumulate(dv, p, gradients(buffer));
    }
    if constexpr (AddsQueryGradient) {  // dS^T stored before the product that reads ds is issued
      Tiles::store_packed(score_gradients, ds);
      Tiles::landed();
    }
    Tiles::start_accumulate(dk, ds, queries(buffer));  // dK += dS^T Q
    if constexpr (AddsQueryGradient) {
      __syncthreads();  // every warp's rows of dS^T are in place
      constexpr int kColumns = Tiles::kTransposedColumns;
      for (int column0 = 0; column0 < hs; column0 += kColumns) {  // dQ += dS K, kColumns channels at a time
        float dq[kColumns / 8][4];
        Tiles::template multiply_transposed<kColumns>(dq, score_gradients, k, column0);
        add_rows_atomically<kColumns>(dq_rows, head.C, T_, hs, q0 + warp * 16, column0, dq);
      }
    }
    if constexpr (kDropsAfterScoreGradients)
      Tiles::finish(dk, dv);
    else
      Tiles::finish(dk);
    if (tile + 1 < tiles) statistics[(1 - buffer) * 2 * kTileRows + threadIdx.x] = next_statistic;
  }

  if (codes.rows) {
    __syncthreads();  // no warp still reads the tiles, whose memory now stages the gradient
    unsigned char* const staged_dv = shared + kTileCodesSharedBytes<T, HS>;
    const int rows = min(kTileRows, T_ - k0);
    const float unscaled[2] = {1.0f, 1.0f}, dv_scaled[2] = {dv_scale, dv_scale};
    stage_tile<T, HS>(dk, unscaled, rows, hs, shared);
    stage_tile<T, HS>(dv, dv_scaled, rows, hs, staged_dv);
    __syncthreads();
    const CodesTile dk_tile = codes_tile(NH, T_, hs, k0, 1, 3), dv_tile = codes_tile(NH, T_, hs, k0, 2, 3);
    cast_staged_tile<T, HS>(codes, dk_tile, shared);
    cast_staged_tile<T, HS>(codes, dv_tile, staged_dv);
    __syncthreads();
    store_tile_codes<T, HS>(codes, dk_tile, shared);
    store_tile_codes<T, HS>(codes, dv_tile, staged_dv);
    return;
  }
  const float unscaled[2] = {1.0f, 1.0f}, dv_scaled[2] = {dv_scale, dv_scale};
  T* rows = dqkv + head.qkv_offset;
  store_rows<T, HS>(rows + head.C, head.stride, T_, hs, k0 + warp * 16, dk, unscaled);
  store_rows<T, HS>(rows + 2 * head.C, head.stride, T_, hs, k0 + warp * 16, dv, dv_scaled);
#endif
}

// A block's dQ tile, every warp's 16 rows final: stored into dqkv's q part, or with fp8 codes
// written only as codes (attention_tile_codes.cuh, in `shared`: kTileCodesSharedBytes<T, HS>).
template <typename T, int HS>
__device__ void store_query_gradient(const float (&dq)[HS / 8][4], T* dqkv, const Head& head, int NH, int T_, int hs,
                                     int q0, const AttentionCodes& codes, unsigned char* shared) {
  const float unscaled[2] = {1.0f, 1.0f};
  if (codes.rows) {
    write_tile_codes<T, HS>(dq, unscaled, codes, NH, T_, hs, q0, 0, 3, shared);
    return;
  }
  store_rows<T, HS>(dqkv + head.qkv_offset, head.stride, T_, hs, q0 + static_cast<int>(threadIdx.x) / 32 * 16, dq,
                    unscaled);
}

template <typename T, int HS, typename Tiles, bool Dropout>
__global__ void __launch_bounds__(kThreads)
    query_gradients_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                           const float* row_dots, const int32_t* key_mask, int NH, int T_, int hs,
                           bool causal, float scale, AttentionCodes codes, DropoutMask dropout) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const BackwardTiles<T, Tiles> tiles_at{reinterpret_cast<T*>(shared)};
  T* const q = tiles_at.own(0);
  T* const g = tiles_at.own(1);
  const auto keys = [&](int buffer) { return tiles_at.first(buffer); };
  const auto values = [&](int buffer) { return tiles_at.second(buffer); };

  const Head head(NH, T_, hs);
  const int q0 = static_cast<int>(blockIdx.x) * kTileRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4;
  const T* sequence = qkv + head.qkv_offset;
  const Visibility visible{T_, causal, key_mask ? key_mask + head.key_mask_offset : nullptr};
  const float scale_log2 = scale * kLog2E;
  [[maybe_unused]] const float kept_scale = scale * dropout.scale;  // dP's factor where kept
  // Rows group and group + 8 of this warp's 16: lse in base-2 units, D times scale (as the key kernel's).
  float row_lse[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q0 + warp * 16 + group + r * 8;
    row_lse[r] = query < T_ ? lse[head.statistics_offset + query] * kLog2E : -INFINITY;
    row_dot[r] = query < T_ ? row_dots[head.statistics_offset + query] * scale : 0.0f;
  }

  const int key_end = causal ? min(T_, q0 + kTileRows) : T_;
  const int tiles = (key_end + kTileRows - 1) / kTileRows;
  Tiles::copy(q, sequence + static_cast<int64_t>(q0) * head.stride, T_ - q0, head.stride, hs);
  Tiles::copy(g, dout + head.output_offset + static_cast<int64_t>(q0) * head.C, T_ - q0, head.C, hs);
  Tiles::copy(keys(0), sequence + head.C, T_, head.stride, hs);
  Tiles::copy(values(0), sequence + 2 * head.C, T_, head.stride, hs);
  copy_commit();

  float dq[HS / 8][4];
  zero(dq);
  for (int tile = 0; tile < tiles; ++tile) {
    const int k0 = tile * kTileRows, buffer = tile % 2;
    copy_wait<0>();
    Tiles::landed();
    __syncthreads();  // this tile landed for every thread; no warp still reads the other buffer
    if (tile + 1 < tiles) {
      const int64_t next = static_cast<int64_t>(k0 + kTileRows) * head.stride;
      Tiles::copy(keys(1 - buffer), sequence + head.C + next, T_ - k0 - kTileRows, head.stride, hs);
      Tiles::copy(values(1 - buffer), sequence + 2 * head.C + next, T_ - k0 - kTileRows, head.stride, hs);
      copy_commit();
    }
    // S = Q K^T and dP = dO V^T, independent products, in flight together.
    float s[kTileRows / 8][4], dp[kTileRows / 8][4];
    Tiles::start_scores_from_tile(s, q, keys(buffer));
    Tiles::start_scores_from_tile(dp, g, values(buffer));
    Tiles::finish_all_but_newest(s);  // dP on the tensor cores under P's exponentials
    const bool masked = tile_hides_keys(key_mask != nullptr, causal, q0, k0, T_);
    for_each_element(s, [&](float& score, int row, int column) {  // P
      const float lse_row = row < 8 ? row_lse[0] : row_lse[1];
      const bool seen =
          !masked || (visible(q0 + warp * 16 + row, k0 + column) && lse_row != -INFINITY);
      score = seen ? exp2_flushed(fmaf(score, scale_log2, -lse_row)) : 0.0f;
    });
    [[maybe_unused]] uint32_t keep = 0;
    if constexpr (Dropout) keep = keep_by_query_rows(dropout, head.statistics_offset, T_, q0 + warp * 16, k0);
    Tiles::finish(dp);
#pragma unroll
    for (int n = 0; n < kTileRows / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // dS, with P rounded as the key kernel's (and dP Z as its dP^T Z)
        const float factor = !Dropout ? scale : (keep >> (4 * n + i) & 1u) ? kept_scale : 0.0f;
        dp[n][i] = to_float(from_float<T>(s[n][i])) * fmaf(dp[n][i], factor, -row_dot[i / 2]);
      }
    uint32_t ds[kTileRows / 16][4];
    pack_fragments<T>(ds, dp);
    Tiles::accumulate(dq, ds, keys(buffer));  // dQ += dS K
  }
  store_query_gradient<T, HS>(dq, dqkv, head, NH, T_, hs, q0, codes, shared);
#endif
}

// dQ from the fp32 sums the key kernel added (when not deterministic): one block per (batch, head)
// and 64 queries, as the query kernel, each warp loading its 16 rows into accumulators and ending as
// the query kernel does. Its shared memory: the codes' staging, with fp8 codes only.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads)
    query_gradient_from_sums_kernel(T* dqkv, const float* dq_sums, int NH, int T_, int hs, AttentionCodes codes) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const Head head(NH, T_, hs);
  const int q0 = static_cast<int>(blockIdx.x) * kTileRows;
  float dq[HS / 8][4];
  load_rows<HS>(dq, dq_sums + head.output_offset, head.C, T_, hs, q0 + static_cast<int>(threadIdx.x) / 32 * 16);
  store_query_gradient<T, HS>(dq, dqkv, head, NH, T_, hs, q0, codes, shared);
#endif
}

template <typename Kernel>
int allow_shared_bytes(Kernel kernel, size_t bytes) {
  return static_cast<int>(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename T, int HS, typename Tiles, bool Dropout>
int backward_of(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                const int32_t* key_mask, int kind, int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal,
                float scale, void* workspace, bool deterministic, const AttentionCodes& codes,
                const DropoutMask& dropout) {
  auto* row_dots = static_cast<float*>(workspace);
  if (const int status = attention_row_dots(row_dots, dout, out, kind, B, seq, NH, hs)) return status;
  const dim3 grid(static_cast<unsigned>((seq + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>(B * NH));
  const auto launch_key_kernel = [&](auto kernel, size_t bytes, float* dq_sums) {
    launch(kernel, grid, kThreads, bytes, static_cast<T*>(dqkv), dq_sums, static_cast<const T*>(dout),
           static_cast<const T*>(qkv), lse, row_dots, key_mask, static_cast<int>(NH), static_cast<int>(seq),
           static_cast<int>(hs), causal, scale, codes, dropout);
  };
  if (deterministic) {
    constexpr size_t bytes = backward_shared_bytes<T, Tiles>();
    const auto key_kernel = key_gradients_kernel<T, HS, Tiles, false, Dropout>;
    const auto query_kernel = query_gradients_kernel<T, HS, Tiles, Dropout>;
    if (const int status = allow_shared_bytes(key_kernel, bytes)) return status;
    if (const int status = allow_shared_bytes(query_kernel, bytes)) return status;
    launch_key_kernel(key_kernel, bytes, nullptr);
    launch(query_kernel, grid, kThreads, bytes, static_cast<T*>(dqkv), static_cast<const T*>(dout),
           static_cast<const T*>(qkv), lse, row_dots, key_mask, static_cast<int>(NH), static_cast<int>(seq),
           static_cast<int>(hs), causal, scale, codes, dropout);
    return static_cast<int>(cudaGetLastError());
  }
  auto* dq_sums =
      reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + attention_query_sums_offset(B, NH, seq));
  if (const int status = fill(dq_sums, kFp32, 0.0f, B * seq * NH * hs)) return status;
  constexpr size_t bytes = backward_shared_bytes<T, Tiles, true>();
  const auto key_kernel = key_gradients_kernel<T, HS, Tiles, true, Dropout>;
  if (const int status = allow_shared_bytes(key_kernel, bytes)) return status;
  launch_key_kernel(key_kernel, bytes, dq_sums);
  const size_t codes_bytes = codes.rows ? kTileCodesSharedBytes<T, HS> : 0;
  launch(query_gradient_from_sums_kernel<T, HS>, grid, kThreads, codes_bytes, static_cast<T*>(dqkv),
         static_cast<const float*>(dq_sums), static_cast<int>(NH), static_cast<int>(seq), static_cast<int>(hs), codes);
  return static_cast<int>(cudaGetLastError());
}

template <typename T, int HS, typename Tiles>
int backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
             const int32_t* key_mask, int kind, int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal,
             float scale, void* workspace, bool deterministic, const AttentionCodes& codes,
             const DropoutMask& dropout) {
  if (dropout.threshold)  // the Dropout instances
    return backward_of<T, HS, Tiles, true>(dqkv, dout, qkv, out, lse, key_mask, kind, B, seq, NH, hs, causal, scale,
                                           workspace, deterministic, codes, dropout);
  return backward_of<T, HS, Tiles, false>(dqkv, dout, qkv, out, lse, key_mask, kind, B, seq, NH, hs, causal, scale,
                                          workspace, deterministic, codes, dropout);
}

template <typename T, int HS>
int backward_on(bool warpgroup, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                const int32_t* key_mask, int kind, int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal,
                float scale, void* workspace, bool deterministic, const AttentionCodes& codes,
                const DropoutMask& dropout) {
  return warpgroup ? backward<T, HS, CoreMatrixTiles<T, HS>>(dqkv, dout, qkv, out, lse, key_mask, kind, B, seq,
                                                             NH, hs, causal, scale, workspace, deterministic, codes,
                                                             dropout)
                   : backward<T, HS, PaddedTiles<T, HS>>(dqkv, dout, qkv, out, lse, key_mask, kind, B, seq, NH,
                                                         hs, causal, scale, workspace, deterministic, codes, dropout);
}

}  // namespace
}  // namespace flash

// bf16/fp16, head size a multiple of 8 (16-byte loads) up to 128; a head narrower than its tile
// (64 or 128 wide) is zero-padded inside it.
bool tiled_attention_shape(int kind, int64_t head_size) {
  return (kind == kBf16 || kind == kFp16) && tiled_attention_head(head_size);
}

bool tiled_attention_applies(int kind, int64_t head_size, int compute_major) {
  return compute_major >= 8 && tiled_attention_shape(kind, head_size);
}

int flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                             const int32_t* key_mask, int kind, int64_t B, int64_t T, int64_t NH, int64_t HS,
                             bool causal, float scale, void* workspace, bool warpgroup, bool deterministic,
                             const AttentionCodes* codes, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  if (!tiled_attention_shape(kind, HS)) return static_cast<int>(cudaErrorInvalidValue);
  if (codes && (B * T % 16 != 0 || 3 * NH * HS % 16 != 0)) return static_cast<int>(cudaErrorInvalidValue);
  const AttentionCodes plain{};
  const auto run = [&](auto instance) {
    return instance(warpgroup, dqkv, dout, qkv, out, lse, key_mask, kind, B, T, NH, HS, causal, scale,
                    workspace, deterministic, codes ? *codes : plain, dropout);
  };
  if (kind == kBf16)
    return HS <= 64 ? run(flash::backward_on<__nv_bfloat16, 64>)
                    : run(flash::backward_on<__nv_bfloat16, 128>);
  return HS <= 64 ? run(flash::backward_on<__half, 64>) : run(flash::backward_on<__half, 128>);
}

}  // namespace kiln::cuda
