// Fused attention on CUDA cores (general_attention.h). Per block: 16 rows, four per warp, held in
// shared memory as fp32; a tile of 32 partner rows (keys for forward and dQ, queries for dK/dV)
// is loaded, each lane forms its partner's dot products with the warp's rows, and the warp shares
// the resulting probabilities (or score gradients) lane by lane with shuffles to update the rows'
// accumulators, lane l holding channels l, l + 32, ... (kLaneDims of them).
//
// Forward: online softmax per row (running max m and sum l, Dao et al. 2022 Algorithm 1).
// Backward: P = exp(s - lse), dP = dO v^T, dS = P (dP - D) / sqrt(HS); dQ += dS K per query
// block, dV += P^T dO and dK += dS^T Q per key block (Dao 2023 Algorithm 2, split so that no two
// blocks write one gradient row). Attention dropout (ops.h): O accumulates P Z (the sums l stay
// the undropped ones); the backward takes dP Z and dV += (P Z)^T dO, each element's factor drawn
// again from its index ((b NH + h) T + query) T + key.
#include <cuda_runtime.h>

#include <type_traits>

#include "kiln/backend/cuda/attention_visibility.cuh"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/backend/dropout_mask.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // queries (forward, dQ) or keys (dK/dV) per block
constexpr int kSpan = 32;                          // partner rows per tile: one per lane
constexpr int kBlockThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xffffffffu;

// Row stride of a tile whose rows the lanes read one each: odd, so the 32 lanes reading channel d
// of 32 consecutive rows hit 32 different shared-memory banks.
__host__ __device__ inline int odd_stride(int hs) { return hs | 1; }

// Shared floats of a kernel: the block's own rows (one or two tiles of kBlockRows x hs) and the
// partner tiles (two of kSpan x odd_stride(hs)).
size_t shared_bytes(int own_tiles, int hs) {
  return (static_cast<size_t>(own_tiles) * kBlockRows * hs + 2 * static_cast<size_t>(kSpan) * odd_stride(hs)) *
         sizeof(float);
}

// tile[row * ld + c] = source[row * stride + c] in fp32 for row < rows and c < hs; rows at or past
// `available` (the sequence's end) become zeros.
template <typename T>
__device__ void load_rows(float* tile, int ld, const T* source, int64_t stride, int rows, int available, int hs) {
  for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
    const int row = i / hs, column = i % hs;
    tile[row * ld + column] = row < available ? to_float(source[row * stride + column]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int hs) {
  float sum = 0.0f;
  for (int d = 0; d < hs; ++d) sum += a[d] * b[d];
  return sum;
}

// acc[i] += weight * row[lane + 32 i] over this lane's channels.
template <int kLaneDims>
__device__ __forceinline__ void accumulate(float (&acc)[kLaneDims], float weight, const float* row, int lane, int hs) {
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int d = lane + 32 * i;
    if (d < hs) acc[i] += weight * row[d];
  }
}

// Writes this lane's channels of one row, scaled, to `destination` (the row's first channel).
template <typename T, int kLaneDims>
__device__ __forceinline__ void store_row(T* destination, const float (&acc)[kLaneDims], float factor, int lane,
                                          int hs) {
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int d = lane + 32 * i;
    if (d < hs) destination[d] = from_float<T>(acc[i] * factor);
  }
}

// Where the (batch, head) of block row blockIdx.y = b NH + h lives in each tensor.
struct BlockHead {
  int64_t C, stride;   // channels; the row stride of qkv and dqkv (3C)
  int64_t qkv_offset;  // of the head's q at position 0 in qkv and dqkv (k, v: C and 2C further)
  int64_t offset;      // of the head's first channel at position 0 in out and dout ([B, T, C])
  int64_t head;        // of the head's position 0 in lse and D ([B, NH, T])
  Visibility visible;
  __device__ BlockHead(const int32_t* key_mask, int NH, int T_, int hs, bool causal) {
    const int64_t b = blockIdx.y / NH, h = blockIdx.y % NH;
    C = static_cast<int64_t>(NH) * hs;
    stride = 3 * C;
    qkv_offset = b * T_ * stride + h * hs;
    offset = b * T_ * C + h * hs;
    head = (b * NH + h) * T_;
    visible = Visibility{T_, causal, key_mask ? key_mask + b * T_ : nullptr};
  }
  // Attention dropout's factor of (query, key) (1 without dropout).
  __device__ __forceinline__ float dropout_factor(const DropoutMask& dropout, int query, int key, int T_) const {
    return dropout.threshold ? dropout.factor(static_cast<uint64_t>((head + query) * T_ + key)) : 1.0f;
  }
};

template <typename T, int kLaneDims>
__global__ void __launch_bounds__(kBlockThreads) general_forward_kernel(T* out, float* lse, const T* qkv,
                                                                        const int32_t* key_mask, int NH, int T_,
                                                                        int hs, bool causal, float scale,
                                                                        DropoutMask dropout) {
  KILN_DYNAMIC_SHARED_MEMORY(shared_memory);
  float* const shared = reinterpret_cast<float*>(shared_memory);
  const int ld = odd_stride(hs);
  float* q = shared;               // [kBlockRows][hs]
  float* k = q + kBlockRows * hs;  // [kSpan][ld]
  float* v = k + kSpan * ld;       // [kSpan][ld]
  const BlockHead at(key_mask, NH, T_, hs, causal);
  const int q0 = blockIdx.x * kBlockRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C = at.C, stride = at.stride;
  const T* sequence = qkv + at.qkv_offset;
  const Visibility& visible = at.visible;

  load_rows(q, hs, sequence + q0 * stride, stride, kBlockRows, T_ - q0, hs);
  float row_max[kRowsPerWarp], row_sum[kRowsPerWarp], acc[kRowsPerWarp][kLaneDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) acc[r][i] = 0.0f;
  }
  const int key_end = causal ? min(T_, q0 + kBlockRows) : T_;
  for (int k0 = 0; k0 < key_end; k0 += kSpan) {
    __syncthreads();  // every warp is done with the previous k and v (and q is loaded)
    load_rows(k, ld, sequence + C + k0 * stride, stride, kSpan, T_ - k0, hs);
    load_rows(v, ld, sequence + 2 * C + k0 * stride, stride, kSpan, T_ - k0, hs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const float raw = dot(q + row * hs, k + lane * ld, hs);
      const float score = visible(q0 + row, k0 + lane) ? raw * scale : -INFINITY;
      const float new_max = fmaxf(row_max[r], warp_max(score));
      const float p = score == -INFINITY ? 0.0f : expf(score - new_max);
      const float alpha = row_max[r] == -INFINITY ? 0.0f : expf(row_max[r] - new_max);
      row_sum[r] = row_sum[r] * alpha + warp_sum(p);
      row_max[r] = new_max;
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) acc[r][i] *= alpha;
      const float kept = p * at.dropout_factor(dropout, q0 + row, k0 + lane, T_);
      for (int j = 0; j < kSpan; ++j) {  // O += P Z V, one key at a time
        const float weight = __shfl_sync(kFullMask, kept, j);
        if (weight != 0.0f) accumulate(acc[r], weight, v + j * ld, lane, hs);  // same on every lane
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int query = q0 + warp * kRowsPerWarp + r;
    if (query >= T_) continue;
    const float total = row_sum[r];
    store_row(out + at.offset + query * C, acc[r], total > 0.0f ? 1.0f / total : 0.0f, lane, hs);
    if (lane == 0) lse[at.head + query] = total > 0.0f ? row_max[r] + logf(total) : -INFINITY;
  }
}

// dQ of one block of queries: loops over the key tiles they see.
template <typename T, int kLaneDims>
__global__ void __launch_bounds__(kBlockThreads) general_backward_q_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                           const float* lse, const float* row_dots,
                                                                           const int32_t* key_mask, int NH, int T_,
                                                                           int hs, bool causal, float scale,
                                                                           DropoutMask dropout) {
  KILN_DYNAMIC_SHARED_MEMORY(shared_memory);
  float* const shared = reinterpret_cast<float*>(shared_memory);
  const int ld = odd_stride(hs);
  float* q = shared;               // [kBlockRows][hs]
  float* g = q + kBlockRows * hs;  // [kBlockRows][hs], dout
  float* k = g + kBlockRows * hs;  // [kSpan][ld]
  float* v = k + kSpan * ld;       // [kSpan][ld]
  const BlockHead at(key_mask, NH, T_, hs, causal);
  const int q0 = blockIdx.x * kBlockRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C = at.C, stride = at.stride, head = at.head;
  const T* sequence = qkv + at.qkv_offset;
  const Visibility& visible = at.visible;

  load_rows(q, hs, sequence + q0 * stride, stride, kBlockRows, T_ - q0, hs);
  load_rows(g, hs, dout + at.offset + q0 * C, C, kBlockRows, T_ - q0, hs);
  float row_lse[kRowsPerWarp], row_dot[kRowsPerWarp], acc[kRowsPerWarp][kLaneDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int query = q0 + warp * kRowsPerWarp + r;
    row_lse[r] = query < T_ ? lse[head + query] : -INFINITY;
    row_dot[r] = query < T_ ? row_dots[head + query] : 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) acc[r][i] = 0.0f;
  }
  const int key_end = causal ? min(T_, q0 + kBlockRows) : T_;
  for (int k0 = 0; k0 < key_end; k0 += kSpan) {
    __syncthreads();  // every warp is done with the previous k and v (and q, g are loaded)
    load_rows(k, ld, sequence + C + k0 * stride, stride, kSpan, T_ - k0, hs);
    load_rows(v, ld, sequence + 2 * C + k0 * stride, stride, kSpan, T_ - k0, hs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const bool seen = visible(q0 + row, k0 + lane) && row_lse[r] != -INFINITY;
      const float s = dot(q + row * hs, k + lane * ld, hs), dp = dot(g + row * hs, v + lane * ld, hs);
      const float p = seen ? expf(s * scale - row_lse[r]) : 0.0f;
      const float ds = p * (dp * at.dropout_factor(dropout, q0 + row, k0 + lane, T_) - row_dot[r]) * scale;
      for (int j = 0; j < kSpan; ++j) {  // dQ += dS K, one key at a time
        const float weight = __shfl_sync(kFullMask, ds, j);
        if (weight != 0.0f) accumulate(acc[r], weight, k + j * ld, lane, hs);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int query = q0 + warp * kRowsPerWarp + r;
    if (query < T_)
      store_row(dqkv + at.qkv_offset + query * stride, acc[r], 1.0f, lane, hs);
  }
}

// dK and dV of one block of keys: loops over the query tiles that can see them.
template <typename T, int kLaneDims>
__global__ void __launch_bounds__(kBlockThreads) general_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                            const float* lse, const float* row_dots,
                                                                            const int32_t* key_mask, int NH, int T_,
                                                                            int hs, bool causal, float scale,
                                                                            DropoutMask dropout) {
  KILN_DYNAMIC_SHARED_MEMORY(shared_memory);
  float* const shared = reinterpret_cast<float*>(shared_memory);
  const int ld = odd_stride(hs);
  float* k = shared;               // [kBlockRows][hs]
  float* v = k + kBlockRows * hs;  // [kBlockRows][hs]
  float* q = v + kBlockRows * hs;  // [kSpan][ld]
  float* g = q + kSpan * ld;       // [kSpan][ld], dout
  const BlockHead at(key_mask, NH, T_, hs, causal);
  const int k0 = blockIdx.x * kBlockRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C = at.C, stride = at.stride, head = at.head;
  const T* sequence = qkv + at.qkv_offset;
  const T* gradient = dout + at.offset;
  const Visibility& visible = at.visible;

  load_rows(k, hs, sequence + C + k0 * stride, stride, kBlockRows, T_ - k0, hs);
  load_rows(v, hs, sequence + 2 * C + k0 * stride, stride, kBlockRows, T_ - k0, hs);
  float dk[kRowsPerWarp][kLaneDims], dv[kRowsPerWarp][kLaneDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) dk[r][i] = dv[r][i] = 0.0f;
  for (int q0 = causal ? k0 : 0; q0 < T_; q0 += kSpan) {
    __syncthreads();  // every warp is done with the previous q and g (and k, v are loaded)
    load_rows(q, ld, sequence + q0 * stride, stride, kSpan, T_ - q0, hs);
    load_rows(g, ld, gradient + q0 * C, C, kSpan, T_ - q0, hs);
    __syncthreads();
    const int query = q0 + lane;
    const float query_lse = query < T_ ? lse[head + query] : -INFINITY;
    const float query_dot = query < T_ ? row_dots[head + query] : 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const bool seen = visible(query, k0 + row) && query_lse != -INFINITY;
      const float s = dot(q + lane * ld, k + row * hs, hs), dp = dot(g + lane * ld, v + row * hs, hs);
      const float p = seen ? expf(s * scale - query_lse) : 0.0f;
      const float z = at.dropout_factor(dropout, query, k0 + row, T_);
      const float ds = p * (dp * z - query_dot) * scale, kept = p * z;
      for (int j = 0; j < kSpan; ++j) {  // dV += (P Z)^T dO, dK += dS^T Q, one query at a time
        const float p_j = __shfl_sync(kFullMask, kept, j), ds_j = __shfl_sync(kFullMask, ds, j);
        if (p_j != 0.0f) accumulate(dv[r], p_j, g + j * ld, lane, hs);
        if (ds_j != 0.0f) accumulate(dk[r], ds_j, q + j * ld, lane, hs);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int key = k0 + warp * kRowsPerWarp + r;
    if (key >= T_) continue;
    T* key_row = dqkv + at.qkv_offset + key * stride;
    store_row(key_row + C, dk[r], 1.0f, lane, hs);
    store_row(key_row + 2 * C, dv[r], 1.0f, lane, hs);
  }
}

// One warp per (batch, head, query) row: lanes read consecutive channels, then a warp sum.
template <typename T>
__global__ void row_dots_kernel(float* d, const T* dout, const T* out, int NH, int T_, int hs, int64_t rows) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (i >= rows) return;  // whole warps leave together
  const int64_t b = i / (static_cast<int64_t>(NH) * T_), h = i / T_ % NH, t = i % T_;
  const int64_t base = (b * T_ + t) * NH * hs + h * hs;
  float sum = 0.0f;
  for (int c = lane; c < hs; c += 32) sum += to_float(dout[base + c]) * to_float(out[base + c]);
  sum = warp_sum(sum);
  if (lane == 0) d[i] = sum;
}

// Sets the kernel's dynamic shared memory limit to `bytes` and launches it over the (row block,
// batch x head) grid; returns the status.
template <typename Kernel, typename... Args>
int launch_over_row_blocks(Kernel kernel, size_t bytes, int64_t B, int64_t T, int64_t NH,
                           Args... args) {
  if (const cudaError_t status =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)))
    return static_cast<int>(status);
  const dim3 grid(static_cast<unsigned>((T + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(B * NH));
  launch(kernel, grid, kBlockThreads, bytes, args...);
  return launch_status();
}

// Calls run(Element{}, std::integral_constant<int, lane dims>{}) for the 16-bit storage type of
// `kind` and the fewest channels per lane that cover hs.
template <typename Run>
int dispatch_head(int kind, int64_t hs, Run run) {
  if (hs <= 0 || hs > kGeneralAttentionMaxHeadSize || (kind != kBf16 && kind != kFp16))
    return static_cast<int>(cudaErrorInvalidValue);
  const auto by_width = [&](auto element) {
    if (hs <= 64) return run(element, std::integral_constant<int, 2>{});
    if (hs <= 128) return run(element, std::integral_constant<int, 4>{});
    return run(element, std::integral_constant<int, 8>{});
  };
  return kind == kBf16 ? by_width(__nv_bfloat16{}) : by_width(__half{});
}

}  // namespace

int general_attention_forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int kind, int64_t B,
                              int64_t T, int64_t NH, int64_t HS, bool causal, float scale, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  return dispatch_head(kind, HS, [&](auto element, auto lane_dims) {
    using E = decltype(element);
    return launch_over_row_blocks(general_forward_kernel<E, decltype(lane_dims)::value>,
                                  shared_bytes(1, static_cast<int>(HS)), B, T, NH,
                                  static_cast<E*>(out), lse, static_cast<const E*>(qkv), key_mask,
                                  static_cast<int>(NH), static_cast<int>(T), static_cast<int>(HS),
                                  causal, scale, dropout);
  });
}

int general_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                               const int32_t* key_mask, int kind, int64_t B, int64_t T, int64_t NH, int64_t HS,
                               bool causal, float scale, void* workspace, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  auto* row_dots = static_cast<float*>(workspace);
  if (const int status = attention_row_dots(row_dots, dout, out, kind, B, T, NH, HS)) return status;
  return dispatch_head(kind, HS, [&](auto element, auto lane_dims) {
    using E = decltype(element);
    constexpr int kLaneDims = decltype(lane_dims)::value;
    const size_t bytes = shared_bytes(2, static_cast<int>(HS));
    const auto arguments = [&](auto kernel) {
      return launch_over_row_blocks(
          kernel, bytes, B, T, NH, static_cast<E*>(dqkv), static_cast<const E*>(dout),
          static_cast<const E*>(qkv), lse, static_cast<const float*>(row_dots), key_mask,
          static_cast<int>(NH), static_cast<int>(T), static_cast<int>(HS), causal, scale, dropout);
    };
    if (const int status = arguments(general_backward_kv_kernel<E, kLaneDims>)) return status;
    return arguments(general_backward_q_kernel<E, kLaneDims>);
  });
}

int attention_row_dots(float* d, const void* dout, const void* out, int kind, int64_t B, int64_t T, int64_t NH,
                       int64_t HS) {
  const int64_t rows = B * NH * T;
  if (rows == 0) return 0;
  return dispatch(kind, [&](auto element) {
    using E = decltype(element);
    launch(row_dots_kernel<E>, static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, d,
           static_cast<const E*>(dout), static_cast<const E*>(out), static_cast<int>(NH),
           static_cast<int>(T), static_cast<int>(HS), rows);
    return launch_status();
  });
}

}  // namespace kiln::cuda
