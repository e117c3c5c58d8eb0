// Fused attention forward on tensor cores (flash_attention.h) with every matrix fragment in
// registers: the FlashAttention-2 forward (Dao 2023, Algorithm 1). One block of four warps per
// (batch, head) and 64 queries; warp w owns queries [16w, 16w + 16). Per 64-key tile:
//   S = Q K^T with mma.sync m16n8k16 (fp32 accumulators: this warp's 16 x 64 scores, 32 per lane);
//   online softmax on those registers: running maximum m and sum l per row (Milakov & Gimelshein
//   2018), in base 2 (exp(x) = 2^(x log2 e), the scale folded in), a row's four lanes combining
//   their maxima with two shuffles; O *= 2^(m_old - m_new);
//   O += P V, where P is the score accumulators rounded to 16 bits: the accumulator layout of an
//   m16n8 product is, pair by pair, the A-operand layout of the next m16n8k16 product (PTX ISA),
//   so P never leaves registers.
// At the end out = O / l and lse = (m + log2 l) ln 2 (natural log, for the backward kernels).
// Q, K and V tiles reach shared memory by cp.async; K and V are double-buffered, so the next
// tile's copy runs under this tile's products, with one __syncthreads per tile. Rows are padded by
// 16 bytes, so the 8 row addresses of an ldmatrix fall in distinct banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch.cuh"
#include "kiln/backend/cuda/warp_matrix.cuh"

// The kernel needs sm_80 (bf16 mma.sync, ldmatrix, cp.async); compiled for older targets its body
// is empty (the host never launches it there), which leaves the helpers below unreferenced.
// Without __CUDA_ARCH__ (nvcc's host pass, and the host compiler building tests/cuda_emulator) the
// body is kept.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define KILN_TENSOR_CORE_BODIES 0
#pragma nv_diag_suppress 177
#else
#define KILN_TENSOR_CORE_BODIES 1
#endif

namespace kiln::cuda {
namespace {

constexpr int kRows = 64;  // queries per block
constexpr int kKeys = 64;  // keys per tile
constexpr int kWarps = kRows / 16;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullWarp = 0xffffffffu;

template <int HS>
constexpr int kPitch = HS + 8;  // elements per shared row: 16 bytes of padding

// Queues the copy of min(rows, 64) rows of hs elements (`stride` apart; hs a multiple of 8) into a
// [64][kPitch] tile; rows past `rows` and columns past hs become zeros, so they add nothing to any
// product. The calling thread's part only: cp.async groups are per thread.
template <typename T, int HS>
__device__ void copy_tile(T* tile, const T* source, int rows, int64_t stride, int hs) {
  constexpr int kChunksPerRow = HS / 8;  // 16 bytes each
  for (int chunk = static_cast<int>(threadIdx.x); chunk < 64 * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow, column = chunk % kChunksPerRow * 8;
    const bool inside = row < rows && column < hs;
    copy_async_16(tile + row * kPitch<HS> + column,
                  inside ? source + row * stride + column : source, inside);
  }
}

template <typename T, int HS>
constexpr size_t forward_shared_bytes() {  // Q, then K and V twice
  return static_cast<size_t>(kRows + 4 * kKeys) * kPitch<HS> * sizeof(T);
}

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* key_mask, int NH, int T_,
                         int hs, bool causal, float scale) {
#if KILN_TENSOR_CORE_BODIES
  constexpr int kPitchHS = kPitch<HS>;
  constexpr int kSteps = HS / 16;         // k-steps of Q K^T
  constexpr int kOutTiles = HS / 8;       // m16n8 tiles of O
  constexpr int kScoreTiles = kKeys / 8;  // m16n8 tiles of S
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  T* const q = reinterpret_cast<T*>(shared);
  const auto keys = [&](int buffer) { return q + (kRows + 2 * buffer * kKeys) * kPitchHS; };
  const auto values = [&](int buffer) { return keys(buffer) + kKeys * kPitchHS; };

  const int b = static_cast<int>(blockIdx.y) / NH, h = static_cast<int>(blockIdx.y) % NH;
  const int q0 = static_cast<int>(blockIdx.x) * kRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4,
            in_group = lane % 4;  // the PTX fragment layouts' groupID, threadID_in_group
  const int64_t C = static_cast<int64_t>(NH) * hs, stride = 3 * C;
  const T* sequence = qkv + static_cast<int64_t>(b) * T_ * stride + h * hs;
  const Visibility visible{T_, causal,
                           key_mask ? key_mask + static_cast<int64_t>(b) * T_ : nullptr};
  const float scale_log2 = scale * 1.44269504088896341f;  // log2(e)

  const int key_end = causal ? min(T_, q0 + kRows) : T_;
  const int tiles = (key_end + kKeys - 1) / kKeys;
  copy_tile<T, HS>(q, sequence + static_cast<int64_t>(q0) * stride, T_ - q0, stride, hs);
  copy_tile<T, HS>(keys(0), sequence + C, T_, stride, hs);
  copy_tile<T, HS>(values(0), sequence + 2 * C, T_, stride, hs);
  copy_commit();

  uint32_t q_fragments[kSteps][4];
  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Rows `group` and `group + 8` of this warp's 16: maxima (base-2 units), and this lane's part of
  // the sums (its columns only: the four lanes of a row add theirs at the end).
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < tiles; ++tile) {
    const int k0 = tile * kKeys;
    copy_wait<0>();
    __syncthreads();  // this tile (and Q) landed for every thread; no warp still reads the other
                      // buffer
    if (tile + 1 < tiles) {
      const int64_t next = static_cast<int64_t>(k0 + kKeys) * stride;
      copy_tile<T, HS>(keys((tile + 1) % 2), sequence + C + next, T_ - k0 - kKeys, stride, hs);
      copy_tile<T, HS>(values((tile + 1) % 2), sequence + 2 * C + next, T_ - k0 - kKeys, stride,
                       hs);
      copy_commit();
    }
    if (tile == 0) {  // this warp's 16 rows of Q as A fragments, kept for every tile
#pragma unroll
      for (int step = 0; step < kSteps; ++step)
        load_matrices(q_fragments[step],
                      q + (warp * 16 + lane % 16) * kPitchHS + step * 16 + lane / 16 * 8);
    }

    // S = Q K^T. B[k][n] = K[n][k]: the rows of K are B's columns, as ldmatrix (untransposed) gives
    // them.
    const T* k_tile = keys(tile % 2);
    float s[kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int pair = 0; pair < kScoreTiles / 2; ++pair)
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        uint32_t k_fragments[4];  // b0, b1 of score tiles 2 pair and 2 pair + 1
        load_matrices(k_fragments, k_tile + (pair * 16 + lane % 8 + lane / 16 * 8) * kPitchHS +
                                       step * 16 + lane / 8 % 2 * 8);
        const uint32_t first[2] = {k_fragments[0], k_fragments[1]},
                       second[2] = {k_fragments[2], k_fragments[3]};
        mma_16x8x16<T>(s[2 * pair], q_fragments[step], first);
        mma_16x8x16<T>(s[2 * pair + 1], q_fragments[step], second);
      }

    // Scale into base-2 units; keys a query does not see become -inf (only tiles that have any).
    const bool masked = key_mask != nullptr || k0 + kKeys > T_ || (causal && k0 + kKeys - 1 > q0);
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int query = q0 + warp * 16 + group + i / 2 * 8,
                  key = k0 + n * 8 + 2 * in_group + i % 2;
        s[n][i] = !masked || visible(query, key) ? s[n][i] * scale_log2 : -INFINITY;
      }

    // Online softmax; s becomes P = 2^(s - m_new).
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      const float base =
          new_max == -INFINITY ? 0.0f : new_max;  // a row that sees no key yet: no -inf - -inf
      rescale[r] = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[n][2 * r + c] = exp2f(s[n][2 * r + c] - base);
          tile_sum += s[n][2 * r + c];
        }
      row_sum[r] = row_sum[r] * rescale[r] + tile_sum;
    }
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }

    // O += P V. P's A fragment for keys [16 step, 16 step + 16) is score tiles 2 step and
    // 2 step + 1; B[k][n] = V[k][n] comes from V's rows through ldmatrix's transpose.
    const T* v_tile = values(tile % 2);
#pragma unroll
    for (int step = 0; step < kKeys / 16; ++step) {
      const uint32_t p[4] = {pack_pair<T>(s[2 * step][0], s[2 * step][1]),
                             pack_pair<T>(s[2 * step][2], s[2 * step][3]),
                             pack_pair<T>(s[2 * step + 1][0], s[2 * step + 1][1]),
                             pack_pair<T>(s[2 * step + 1][2], s[2 * step + 1][3])};
#pragma unroll
      for (int pair = 0; pair < HS / 16; ++pair) {
        uint32_t v_fragments[4];  // b0, b1 of output tiles 2 pair and 2 pair + 1
        load_matrices_transposed(
            v_fragments, v_tile + (step * 16 + lane % 8 + lane / 8 % 2 * 8) * kPitchHS + pair * 16 +
                             lane / 16 * 8);
        const uint32_t first[2] = {v_fragments[0], v_fragments[1]},
                       second[2] = {v_fragments[2], v_fragments[3]};
        mma_16x8x16<T>(o[2 * pair], p, first);
        mma_16x8x16<T>(o[2 * pair + 1], p, second);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(kFullWarp, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(kFullWarp, row_sum[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int query = q0 + warp * 16 + group + r * 8;
    if (query >= T_) continue;
    const float inverse =
        row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;  // a row that sees no key: zeros
    T* row_out = out + (static_cast<int64_t>(b) * T_ + query) * C + h * hs;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      const int column = n * 8 + 2 * in_group;  // hs is a multiple of 8: both columns or neither
      if (column < hs)
        *reinterpret_cast<uint32_t*>(row_out + column) =
            pack_pair<T>(o[n][2 * r] * inverse, o[n][2 * r + 1] * inverse);
    }
    if (in_group == 0)
      lse[(static_cast<int64_t>(b) * NH + h) * T_ + query] =
          row_sum[r] > 0.0f ? (row_max[r] + log2f(row_sum[r])) * 0.69314718055994531f : -INFINITY;
  }
#endif
}

template <typename T, int HS>
int forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int64_t B, int64_t seq,
            int64_t NH, int64_t hs, bool causal, float scale) {
  constexpr size_t bytes = forward_shared_bytes<T, HS>();
  const auto kernel = flash_forward_kernel<T, HS>;
  if (const cudaError_t status =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))
    return static_cast<int>(status);
  const dim3 grid(static_cast<unsigned>((seq + kRows - 1) / kRows), static_cast<unsigned>(B * NH));
  launch(kernel, grid, kThreads, bytes, static_cast<T*>(out), lse, static_cast<const T*>(qkv),
         key_mask, static_cast<int>(NH), static_cast<int>(seq), static_cast<int>(hs), causal,
         scale);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

// The (storage type, tile width) instantiations: the narrowest tile that holds the head.
int flash_attention_forward(void* out, float* lse, const void* qkv, const int32_t* key_mask,
                            int kind, int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal,
                            float scale) {
  if (B * NH * T == 0) return 0;
  if (!tiled_attention_shape(kind, HS)) return static_cast<int>(cudaErrorInvalidValue);
  const auto run = [&](auto instance) {
    return instance(out, lse, qkv, key_mask, B, T, NH, HS, causal, scale);
  };
  if (kind == kBf16)
    return HS <= 64 ? run(forward<__nv_bfloat16, 64>) : run(forward<__nv_bfloat16, 128>);
  return HS <= 64 ? run(forward<__half, 64>) : run(forward<__half, 128>);
}

}  // namespace kiln::cuda
