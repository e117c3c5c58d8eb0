// Fused attention backward on tensor cores (flash_attention.h; the forward is flash_forward.cu).
// One block of four warps per (batch, head) and 64-row tile; warp w owns rows [16w, 16w + 16) of
// every 64 x 64 or 64 x HS tile it computes, so the bookkeeping between products needs only warp
// barriers; tiles that all warps read (P and dS in the dK/dV kernel) are fenced with block barriers.
//
// D = rowsum(dout * out) first; then per key tile: P = exp(s - lse), dV += P^T dO, dP = dO V^T,
// dS = P (dP - D) / sqrt(HS), dK += dS^T Q; and per query tile the same P and dS with dQ += dS K
// (Dao 2023 Algorithm 2, split so that no two blocks write one gradient row). dK, dV and dQ stay in
// WMMA accumulators in registers for the whole tile loop (WarpRows); S, P, dP and dS pass through
// shared memory, since WMMA does not document its fragment layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/element.cuh"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch.cuh"

// The kernels need sm_80 (bf16 tensor cores); compiled for older targets their bodies are empty
// (the host never launches them there), which leaves the helpers below unreferenced. Without
// __CUDA_ARCH__ (nvcc's host pass, and the host compiler building tests/cuda_emulator) the bodies
// are kept.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define KILN_TENSOR_CORE_BODIES 0
#pragma nv_diag_suppress 177
#else
#define KILN_TENSOR_CORE_BODIES 1
#endif

namespace kiln::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;      // queries or keys per tile
constexpr int kWarps = 4;      // warp w owns tile rows [16w, 16w + 16)
constexpr int kThreads = 32 * kWarps;
constexpr int kFrag = 16;      // WMMA m = n = k

// Copies min(rows, kTile) rows of hs elements (hs <= HS, a multiple of 8), `stride` elements
// apart, into a [kTile][HS] tile, 16 bytes at a time; rows past `rows` and columns past hs become
// zeros, so a head narrower than the tile adds nothing to any product.
template <typename T, int HS>
__device__ void load_tile(T* tile, const T* source, int rows, int64_t stride, int hs) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = HS / kChunk;
  for (int chunk = threadIdx.x; chunk < kTile * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow, column = chunk % kChunksPerRow * kChunk;
    int4 value = make_int4(0, 0, 0, 0);
    if (row < rows && column < hs) value = *reinterpret_cast<const int4*>(source + row * stride + column);
    *reinterpret_cast<int4*>(tile + row * HS + column) = value;
  }
}

using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// One warp: acc += A B over k_steps slices of 16, A and B read from shared memory in the given
// layouts; slice kk starts at a + kk * a_step and b + kk * b_step.
template <typename T, typename ALayout, typename BLayout>
__device__ void mma_into(Accumulator& acc, const T* a, int lda, int a_step, const T* b, int ldb, int b_step,
                         int k_steps) {
  wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, ALayout> fa;
  wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, BLayout> fb;
  for (int kk = 0; kk < k_steps; ++kk) {
    wmma::load_matrix_sync(fa, a + kk * a_step, lda);
    wmma::load_matrix_sync(fb, b + kk * b_step, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// One warp: the 16 x 16 block c (row-major, fp32, ld ldc) = [c +] A B, as mma_into.
template <typename T, typename ALayout, typename BLayout>
__device__ void mma_block(float* c, int ldc, bool accumulate, const T* a, int lda, int a_step, const T* b, int ldb,
                          int b_step, int k_steps) {
  Accumulator acc;
  if (accumulate) {
    wmma::load_matrix_sync(acc, c, ldc, wmma::mem_row_major);
  } else {
    wmma::fill_fragment(acc, 0.0f);
  }
  mma_into<T, ALayout, BLayout>(acc, a, lda, a_step, b, ldb, b_step, k_steps);
  wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
}

// A warp's 16 x HS rows of fp32 accumulators held in registers across a kernel's tile loop
// (dK, dV and dQ), stored to shared memory once at the end.
template <int HS>
struct WarpRows {
  Accumulator columns[HS / kFrag];
  __device__ WarpRows() {
#pragma unroll
    for (int column = 0; column < HS / kFrag; ++column) wmma::fill_fragment(columns[column], 0.0f);
  }
  // += A B for every 16-column block: A [16 x kTile] at a (layout ALayout, slice step a_step),
  // B [kTile x HS] row-major at b with ld HS.
  template <typename T, typename ALayout>
  __device__ void add(const T* a, int lda, int a_step, const T* b) {
#pragma unroll
    for (int column = 0; column < HS / kFrag; ++column)
      mma_into<T, ALayout, wmma::row_major>(columns[column], a, lda, a_step, b + column * kFrag, HS, kFrag * HS,
                                            kTile / kFrag);
  }
  __device__ void store(float* rows) const {  // [16][HS], row-major
#pragma unroll
    for (int column = 0; column < HS / kFrag; ++column)
      wmma::store_matrix_sync(rows + column * kFrag, columns[column], HS, wmma::mem_row_major);
  }
};

// This warp's 16 rows of S = X Y^T for two [kTile][HS] tiles (queries x keys), into s [kTile][kTile].
template <typename T, int HS>
__device__ void scores(float* s, const T* x, const T* y, int warp) {
  for (int column = 0; column < kTile / kFrag; ++column)
    mma_block<T, wmma::row_major, wmma::col_major>(s + warp * kFrag * kTile + column * kFrag, kTile, false,
                                                   x + warp * kFrag * HS, HS, kFrag, y + column * kFrag * HS, HS,
                                                   kFrag, HS / kFrag);
}

template <typename T, int HS>
constexpr size_t backward_shared_bytes() {  // four input tiles, S/dP, P, dS, two fp32 accumulators
  return 4 * kTile * HS * sizeof(T) + kTile * kTile * sizeof(float) + 2 * kTile * kTile * sizeof(T) +
         2 * kTile * HS * sizeof(float);
}

// The shared state of both backward kernels, laid out in the same order.
template <typename T, int HS>
struct BackwardTiles {
  T *q, *g, *k, *v;  // g: dout
  float* s;          // S, then dP
  T *p, *ds;
  float *acc0, *acc1;
  __device__ explicit BackwardTiles(unsigned char* shared) {
    q = reinterpret_cast<T*>(shared);
    g = q + kTile * HS;
    k = g + kTile * HS;
    v = k + kTile * HS;
    s = reinterpret_cast<float*>(v + kTile * HS);
    p = reinterpret_cast<T*>(s + kTile * kTile);
    ds = p + kTile * kTile;
    acc0 = reinterpret_cast<float*>(ds + kTile * kTile);
    acc1 = acc0 + kTile * HS;
  }
};

// For the tile pair (q0, k0): P of this thread's row into p, and later, once dP = dO V^T is in
// s, dS into ds. Rows are queries; two lanes per row.
template <typename T, int HS>
__device__ void fill_probabilities(T* p, const float* s, int row, int half, int query, int k0, float row_lse,
                                   float scale, const Visibility& visible) {
  for (int c = half * 32; c < half * 32 + 32; ++c) {
    const bool seen = visible(query, k0 + c) && row_lse != -INFINITY;
    p[row * kTile + c] = from_float<T>(seen ? expf(s[row * kTile + c] * scale - row_lse) : 0.0f);
  }
}

template <typename T>
__device__ void fill_score_gradients(T* ds, const T* p, const float* dp, int row, int half, float row_dot,
                                     float scale) {
  for (int c = half * 32; c < half * 32 + 32; ++c)
    ds[row * kTile + c] = from_float<T>(to_float(p[row * kTile + c]) * (dp[row * kTile + c] - row_dot) * scale);
}

// dK and dV of one key tile: loops over the query tiles that can see it.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) flash_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                     const float* lse, const float* row_dots,
                                                                     const int32_t* key_mask, int NH, int T_,
                                                                     int hs, bool causal, float scale) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const BackwardTiles<T, HS> t(shared);
  float *dk = t.acc0, *dv = t.acc1;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, k0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = threadIdx.x / 2, half = threadIdx.x % 2;
  const int64_t C = static_cast<int64_t>(NH) * hs, stride = 3 * C;
  const T* sequence = qkv + static_cast<int64_t>(b) * T_ * stride + h * hs;
  const T* gradient = dout + static_cast<int64_t>(b) * T_ * C + h * hs;
  const float* head_lse = lse + (static_cast<int64_t>(b) * NH + h) * T_;
  const float* head_dots = row_dots + (static_cast<int64_t>(b) * NH + h) * T_;
  const Visibility visible{T_, causal, key_mask ? key_mask + static_cast<int64_t>(b) * T_ : nullptr};

  load_tile<T, HS>(t.k, sequence + C + k0 * stride, T_ - k0, stride, hs);
  load_tile<T, HS>(t.v, sequence + 2 * C + k0 * stride, T_ - k0, stride, hs);
  WarpRows<HS> dk_rows, dv_rows;  // this warp's 16 keys
  for (int q0 = causal ? k0 : 0; q0 < T_; q0 += kTile) {
    __syncthreads();  // every warp is done with the previous q, dout, P and dS
    load_tile<T, HS>(t.q, sequence + q0 * stride, T_ - q0, stride, hs);
    load_tile<T, HS>(t.g, gradient + q0 * C, T_ - q0, C, hs);
    __syncthreads();
    const int query = q0 + row;
    scores<T, HS>(t.s, t.q, t.k, warp);
    __syncwarp();
    fill_probabilities<T, HS>(t.p, t.s, row, half, query, k0, query < T_ ? head_lse[query] : -INFINITY, scale,
                              visible);
    __syncthreads();  // dV reads every row of P
    dv_rows.template add<T, wmma::col_major>(t.p + warp * kFrag, kTile, kFrag * kTile, t.g);  // dV += P^T dO (rows: keys)
    for (int column = 0; column < kTile / kFrag; ++column)  // dP = dO V^T (rows: queries)
      mma_block<T, wmma::row_major, wmma::col_major>(t.s + warp * kFrag * kTile + column * kFrag, kTile, false,
                                                     t.g + warp * kFrag * HS, HS, kFrag, t.v + column * kFrag * HS,
                                                     HS, kFrag, HS / kFrag);
    __syncwarp();
    fill_score_gradients(t.ds, t.p, t.s, row, half, query < T_ ? head_dots[query] : 0.0f, scale);
    __syncthreads();  // dK reads every row of dS
    dk_rows.template add<T, wmma::col_major>(t.ds + warp * kFrag, kTile, kFrag * kTile, t.q);  // dK += dS^T Q
  }
  dk_rows.store(dk + warp * kFrag * HS);
  dv_rows.store(dv + warp * kFrag * HS);
  __syncwarp();
  for (int i = lane; i < kFrag * HS; i += 32) {
    const int key = k0 + warp * kFrag + i / HS;
    if (key >= T_ || i % HS >= hs) continue;
    T* key_row = dqkv + (static_cast<int64_t>(b) * T_ + key) * stride + h * hs + i % HS;
    key_row[C] = from_float<T>(dk[warp * kFrag * HS + i]);
    key_row[2 * C] = from_float<T>(dv[warp * kFrag * HS + i]);
  }
#endif
}

// dQ of one query tile: loops over the key tiles it sees. Every product is this warp's rows.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) flash_backward_q_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                    const float* lse, const float* row_dots,
                                                                    const int32_t* key_mask, int NH, int T_,
                                                                    int hs, bool causal, float scale) {
#if KILN_TENSOR_CORE_BODIES
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const BackwardTiles<T, HS> t(shared);
  float* dq = t.acc0;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = threadIdx.x / 2, half = threadIdx.x % 2;
  const int query = q0 + row;
  const int64_t C = static_cast<int64_t>(NH) * hs, stride = 3 * C;
  const T* sequence = qkv + static_cast<int64_t>(b) * T_ * stride + h * hs;
  const int64_t head = (static_cast<int64_t>(b) * NH + h) * T_;
  const float row_lse = query < T_ ? lse[head + query] : -INFINITY;
  const float row_dot = query < T_ ? row_dots[head + query] : 0.0f;
  const Visibility visible{T_, causal, key_mask ? key_mask + static_cast<int64_t>(b) * T_ : nullptr};

  load_tile<T, HS>(t.q, sequence + q0 * stride, T_ - q0, stride, hs);
  load_tile<T, HS>(t.g, dout + static_cast<int64_t>(b) * T_ * C + h * hs + q0 * C, T_ - q0, C, hs);
  WarpRows<HS> dq_rows;  // this warp's 16 queries
  const int key_end = causal ? min(T_, q0 + kTile) : T_;
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous k and v
    load_tile<T, HS>(t.k, sequence + C + k0 * stride, T_ - k0, stride, hs);
    load_tile<T, HS>(t.v, sequence + 2 * C + k0 * stride, T_ - k0, stride, hs);
    __syncthreads();
    scores<T, HS>(t.s, t.q, t.k, warp);
    __syncwarp();
    fill_probabilities<T, HS>(t.p, t.s, row, half, query, k0, row_lse, scale, visible);
    __syncwarp();
    for (int column = 0; column < kTile / kFrag; ++column)  // dP = dO V^T
      mma_block<T, wmma::row_major, wmma::col_major>(t.s + warp * kFrag * kTile + column * kFrag, kTile, false,
                                                     t.g + warp * kFrag * HS, HS, kFrag, t.v + column * kFrag * HS,
                                                     HS, kFrag, HS / kFrag);
    __syncwarp();
    fill_score_gradients(t.ds, t.p, t.s, row, half, row_dot, scale);
    __syncwarp();
    dq_rows.template add<T, wmma::row_major>(t.ds + warp * kFrag * kTile, kTile, kFrag, t.k);  // dQ += dS K
  }
  dq_rows.store(dq + warp * kFrag * HS);
  __syncwarp();
  for (int i = lane; i < kFrag * HS; i += 32) {
    const int r = q0 + warp * kFrag + i / HS;
    if (r < T_ && i % HS < hs)
      dqkv[(static_cast<int64_t>(b) * T_ + r) * stride + h * hs + i % HS] = from_float<T>(dq[warp * kFrag * HS + i]);
  }
#endif
}

int launch_status() { return static_cast<int>(cudaGetLastError()); }

template <typename T, int HS>
int backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
             const int32_t* key_mask, int kind, int64_t B, int64_t seq, int64_t NH, int64_t hs, bool causal,
             float scale, void* workspace) {
  auto* row_dots = static_cast<float*>(workspace);
  if (const int status = attention_row_dots(row_dots, dout, out, kind, B, seq, NH, hs)) return status;
  constexpr size_t bytes = backward_shared_bytes<T, HS>();
  const auto kv_kernel = flash_backward_kv_kernel<T, HS>;
  const auto q_kernel = flash_backward_q_kernel<T, HS>;
  for (const void* kernel : {reinterpret_cast<const void*>(kv_kernel), reinterpret_cast<const void*>(q_kernel)})
    if (const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))
      return static_cast<int>(status);
  const dim3 grid(static_cast<unsigned>((seq + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
  launch(kv_kernel, grid, kThreads, bytes, static_cast<T*>(dqkv), static_cast<const T*>(dout),
         static_cast<const T*>(qkv), lse, row_dots, key_mask, static_cast<int>(NH),
         static_cast<int>(seq), static_cast<int>(hs), causal, scale);
  launch(q_kernel, grid, kThreads, bytes, static_cast<T*>(dqkv), static_cast<const T*>(dout),
         static_cast<const T*>(qkv), lse, row_dots, key_mask, static_cast<int>(NH),
         static_cast<int>(seq), static_cast<int>(hs), causal, scale);
  return launch_status();
}

}  // namespace

// bf16/fp16, head size a multiple of 8 (16-byte loads) up to 128; a head narrower than its tile
// (64 or 128 wide) is zero-padded inside it.
bool tiled_attention_shape(int kind, int64_t head_size) {
  return (kind == kBf16 || kind == kFp16) && head_size > 0 && head_size <= 128 && head_size % 8 == 0;
}

bool tiled_attention_applies(int kind, int64_t head_size, int compute_major) {
  return compute_major >= 8 && tiled_attention_shape(kind, head_size);
}

int flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                             const int32_t* key_mask, int kind, int64_t B, int64_t T, int64_t NH, int64_t HS,
                             bool causal, float scale, void* workspace) {
  if (B * NH * T == 0) return 0;
  if (!tiled_attention_shape(kind, HS)) return static_cast<int>(cudaErrorInvalidValue);
  const auto run = [&](auto instance) {
    return instance(dqkv, dout, qkv, out, lse, key_mask, kind, B, T, NH, HS, causal, scale,
                    workspace);
  };
  if (kind == kBf16) return HS <= 64 ? run(backward<__nv_bfloat16, 64>) : run(backward<__nv_bfloat16, 128>);
  return HS <= 64 ? run(backward<__half, 64>) : run(backward<__half, 128>);
}

}  // namespace kiln::cuda
