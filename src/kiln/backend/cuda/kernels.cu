// Kernels of the CUDA back-end, first version: correct and deterministic, written plainly.
// Each launcher mirrors the CPU reference op of the same name; the op table (tests/backend)
// checks one against the other in fp32, bf16 and fp16. Every kernel is a template over the
// storage type of its activations and computes in fp32 (kernels.h). Speed work (fusion, flash
// attention) replaces these later.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kiln/backend/cuda/element.cuh"
#include "kiln/backend/cuda/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

int launch_status() { return static_cast<int>(cudaGetLastError()); }

__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Block-wide sum for blockDim.x == kThreads; every thread gets the result.
__device__ float block_sum(float value) {
  __shared__ float shared[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kThreads / 32 ? shared[lane] : 0.0f;
  value = warp_sum(value);
  __syncthreads();
  return value;
}

__device__ float block_max(float value) {
  __shared__ float shared[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_max(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kThreads / 32 ? shared[lane] : -INFINITY;
  value = warp_max(value);
  __syncthreads();
  return value;
}

#define GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Calls launch(T{}) with T the storage type of `kind`; returns its status.
template <typename Launch>
int dispatch(int kind, Launch launch) {
  switch (kind) {
    case kFp32: return launch(float{});
    case kBf16: return launch(__nv_bfloat16{});
    case kFp16: return launch(__half{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// ---- embedding -------------------------------------------------------------------------------
template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t T_,
                                         int64_t C, int64_t count) {
  GRID_STRIDE(i, count) {
    const int64_t position = i / C, c = i % C;
    out[i] = from_float<T>(to_float(wte[tokens[position] * C + c]) + to_float(wpe[(position % T_) * C + c]));
  }
}

// dwte without atomics: positions arrive sorted by token (stable, so in position order within a
// token); the block that starts a run of equal tokens adds the run's rows in order.
template <typename T>
__global__ void embedding_backward_tokens_kernel(float* dwte, const T* dout, const int32_t* sorted_tokens,
                                                 const int32_t* sorted_positions, int64_t positions, int64_t C) {
  const int64_t start = blockIdx.x;
  if (start >= positions || (start > 0 && sorted_tokens[start] == sorted_tokens[start - 1])) return;
  const int32_t token = sorted_tokens[start];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = start; i < positions && sorted_tokens[i] == token; ++i)
      sum += to_float(dout[sorted_positions[i] * C + c]);
    dwte[token * C + c] += sum;
  }
}

// dwpe[t] += sum over the batch of dout[b, t], in batch order.
template <typename T>
__global__ void embedding_backward_positions_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  GRID_STRIDE(i, T_ * C) {
    float sum = 0.0f;
    for (int64_t b = 0; b < B; ++b) sum += to_float(dout[b * T_ * C + i]);
    dwpe[i] += sum;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t count) {
  GRID_STRIDE(i, count) out[i] = static_cast<int32_t>(i);
}

// ---- layernorm: one block per row ---------------------------------------------------------------
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean_out, float* rstd_out, const T* in, const T* weight,
                                         const T* bias, const T* residual, T* residual_out, int64_t C, float eps) {
  const int64_t row = blockIdx.x;
  const T* x = in + row * C;
  if (residual != nullptr) {  // fused residual add: normalise the rounded sum it writes
    // Every loop below strides over c exactly like this one, so each thread reads back only the
    // elements it wrote itself (no barrier needed; residual_out may alias in).
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      residual_out[row * C + c] = from_float<T>(to_float(x[c]) + to_float(residual[row * C + c]));
    x = residual_out + row * C;
  }
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += to_float(x[c]);
  const float mean = block_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float centred = to_float(x[c]) - mean;
    squares += centred * centred;
  }
  const float rstd = rsqrtf(block_sum(squares) / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    out[row * C + c] = from_float<T>((to_float(x[c]) - mean) * rstd * to_float(weight[c]) + to_float(bias[c]));
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <typename T>
__global__ void layernorm_backward_input_kernel(T* din, const T* dout, const T* in, const T* weight,
                                                const float* means, const float* rstds, int64_t C) {
  const int64_t row = blockIdx.x;
  const float mean = means[row], rstd = rstds[row];
  const T* x = in + row * C;
  const T* g = dout + row * C;
  float grad_sum = 0.0f, grad_dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gw = to_float(g[c]) * to_float(weight[c]);
    grad_sum += gw;
    grad_dot += gw * (to_float(x[c]) - mean) * rstd;
  }
  const float grad_mean = block_sum(grad_sum) / static_cast<float>(C);
  const float grad_dot_mean = block_sum(grad_dot) / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (to_float(x[c]) - mean) * rstd;
    const float delta = rstd * (to_float(g[c]) * to_float(weight[c]) - grad_mean - xhat * grad_dot_mean);
    din[row * C + c] = from_float<T>(to_float(din[row * C + c]) + delta);
  }
}

// Column sums without atomics, in a fixed order: a block owns 32 columns; its kRowGroups warps
// stride over the rows (coalesced reads per row), then the partial sums are added in row-group
// order through shared memory.
constexpr int kRowGroups = 32;

template <typename Term>
__device__ void column_sums(float* sums_a, float* sums_b, int64_t M, int64_t N, Term term) {
  __shared__ float partial_a[kRowGroups][33], partial_b[kRowGroups][33];
  const int64_t column = blockIdx.x * 32 + threadIdx.x;
  float a = 0.0f, b = 0.0f;
  if (column < N) {
    for (int64_t m = threadIdx.y; m < M; m += kRowGroups) {
      const float2 values = term(m, column);
      a += values.x;
      b += values.y;
    }
  }
  partial_a[threadIdx.y][threadIdx.x] = a;
  partial_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && column < N) {
    for (int g = 1; g < kRowGroups; ++g) {
      a += partial_a[g][threadIdx.x];
      b += partial_b[g][threadIdx.x];
    }
    sums_a[column] += a;
    if (sums_b) sums_b[column] += b;
  }
}

template <typename T>
__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const T* dout, const T* in,
                                                 const float* means, const float* rstds, int64_t M, int64_t C) {
  column_sums(dweight, dbias, M, C, [=] __device__(int64_t m, int64_t c) {
    const float g = to_float(dout[m * C + c]);
    return make_float2(g * (to_float(in[m * C + c]) - means[m]) * rstds[m], g);
  });
}

// ---- bias helpers, elementwise ----------------------------------------------------------------------
template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* row, int64_t N, int64_t count) {
  GRID_STRIDE(i, count) out[i] = row[i % N];
}

template <typename T>
__global__ void column_sums_add_kernel(float* sums, const T* in, int64_t M, int64_t N) {
  column_sums(sums, nullptr, M, N,
              [=] __device__(int64_t m, int64_t n) { return make_float2(to_float(in[m * N + n]), 0.0f); });
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* in, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = to_float(in[i]);
    out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* din, const T* in, const T* dout, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = to_float(in[i]);
    const float tanh_inner = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float sech_squared = 1.0f - tanh_inner * tanh_inner;
    const float local = 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] = from_float<T>(local * to_float(dout[i]));
  }
}

template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t count) {
  GRID_STRIDE(i, count) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <typename T>
__global__ void fill_kernel(T* out, float value, int64_t count) {
  GRID_STRIDE(i, count) out[i] = from_float<T>(value);
}

template <typename Out, typename In>
__global__ void convert_kernel(Out* out, const In* in, int64_t count) {
  GRID_STRIDE(i, count) out[i] = from_float<Out>(to_float(in[i]));
}

// ---- attention softmax: one block per row (b, h, t) of scores ----------------------------------
struct KeyVisibility {
  int64_t last_key;          // causal: the query's own position; else T - 1
  const int32_t* key_mask;   // this sequence's [T] mask, or null
  __device__ bool operator()(int64_t key) const { return key <= last_key && (key_mask == nullptr || key_mask[key] != 0); }
};

__device__ KeyVisibility key_visibility(const int32_t* key_mask, int64_t row, int64_t NH, int64_t T_, bool causal) {
  const int64_t t = row % T_, b = row / (NH * T_);
  return {causal ? t : T_ - 1, key_mask ? key_mask + b * T_ : nullptr};
}

template <typename T>
__global__ void attention_softmax_forward_kernel(T* scores, float* lse, const int32_t* key_mask, int64_t NH,
                                                 int64_t T_, bool causal) {
  const int64_t row = blockIdx.x;  // (b * NH + h) * T + t
  const KeyVisibility visible = key_visibility(key_mask, row, NH, T_, causal);
  T* s = scores + row * T_;
  float max_score = -INFINITY;
  for (int64_t k = threadIdx.x; k < T_; k += blockDim.x)
    if (visible(k)) max_score = fmaxf(max_score, to_float(s[k]));
  max_score = block_max(max_score);
  if (max_score == -INFINITY) {
    for (int64_t k = threadIdx.x; k < T_; k += blockDim.x) s[k] = from_float<T>(0.0f);
    if (threadIdx.x == 0) lse[row] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < T_; k += blockDim.x)
    if (visible(k)) sum += expf(to_float(s[k]) - max_score);
  sum = block_sum(sum);
  const float inverse_sum = 1.0f / sum;
  for (int64_t k = threadIdx.x; k < T_; k += blockDim.x)
    s[k] = from_float<T>(visible(k) ? expf(to_float(s[k]) - max_score) * inverse_sum : 0.0f);
  if (threadIdx.x == 0) lse[row] = max_score + logf(sum);
}

template <typename T>
__global__ void attention_softmax_backward_kernel(T* scores, T* dscores, const float* lse, const T* dout, const T* out,
                                                  const int32_t* key_mask, int64_t NH, int64_t T_, int64_t HS,
                                                  bool causal, float scale) {
  const int64_t row = blockIdx.x;  // (b * NH + h) * T + t
  const KeyVisibility visible = key_visibility(key_mask, row, NH, T_, causal);
  const int64_t t = row % T_, h = (row / T_) % NH, b = row / (NH * T_);
  const int64_t channel0 = (b * T_ + t) * NH * HS + h * HS;  // this query's head slice of [B, T, C]
  float dot = 0.0f;
  for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) dot += to_float(dout[channel0 + d]) * to_float(out[channel0 + d]);
  const float row_dot = block_sum(dot);  // D = rowsum(dout * out)
  const float row_lse = lse[row];
  T* s = scores + row * T_;
  T* ds = dscores + row * T_;
  for (int64_t k = threadIdx.x; k < T_; k += blockDim.x) {
    const float p = visible(k) && row_lse != -INFINITY ? expf(to_float(s[k]) - row_lse) : 0.0f;
    s[k] = from_float<T>(p);
    ds[k] = from_float<T>(p * (to_float(ds[k]) - row_dot) * scale);
  }
}

// ---- cross-entropy: one block per row ---------------------------------------------------------------
template <typename T>
__global__ void cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int64_t V, int64_t Vp,
                                     int32_t ignore_index, float loss_scale, bool write_grad) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int32_t target = targets[row];
  const bool ignored = target == ignore_index;
  float max_logit = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) max_logit = fmaxf(max_logit, to_float(x[v]));
  max_logit = block_max(max_logit);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(to_float(x[v]) - max_logit);
  const float log_sum = logf(block_sum(sum)) + max_logit;
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : log_sum - to_float(x[target]);
  if (!write_grad) return;
  __syncthreads();  // the loss read x[target] before it is overwritten
  for (int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    float grad = 0.0f;
    if (!ignored && v < V) grad = (expf(to_float(x[v]) - log_sum) - (v == target ? 1.0f : 0.0f)) * loss_scale;
    x[v] = from_float<T>(grad);
  }
}

// ---- AdamW --------------------------------------------------------------------------------------------
__global__ void adamw_kernel(float* master, void* param_out, int out_kind, const float* grad, float* m, float* v,
                             int64_t offset, int64_t count, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale, float bias_correction1, float bias_correction2) {
  GRID_STRIDE(j, count) {
    const int64_t i = offset + j;
    const float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float m_hat = m[i] / bias_correction1;
    const float v_hat = v[i] / bias_correction2;
    master[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * master[i]);
    if (out_kind == kFp32) static_cast<float*>(param_out)[i] = master[i];
    if (out_kind == kBf16) static_cast<__nv_bfloat16*>(param_out)[i] = __float2bfloat16_rn(master[i]);
    if (out_kind == kFp16) static_cast<__half*>(param_out)[i] = __float2half_rn(master[i]);
  }
}

// ---- random fill for benchmarks ---------------------------------------------------------------
__global__ void fill_random_kernel(void* out, int kind, int64_t count, uint64_t seed) {
  GRID_STRIDE(i, count) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float value = static_cast<float>(z >> 40) * 0x1.0p-23f - 1.0f;
    if (kind == kFp32) static_cast<float*>(out)[i] = value;
    if (kind == kBf16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(value);
    if (kind == kFp16) static_cast<__half*>(out)[i] = __float2half_rn(value);
  }
}

// ---- sum of squares: fixed grid, fixed order ------------------------------------------------------------
__global__ void sum_squares_partial_kernel(const float* in, int64_t count, double* partials) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  GRID_STRIDE(i, count) sum += static_cast<double>(in[i]) * in[i];
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

__global__ void sum_partials_kernel(const double* partials, int count, double* result) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0.0;
  for (int i = 0; i < count; ++i) total += partials[i];
  *result = total;
}

}  // namespace

int embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int kind, int64_t B,
                      int64_t T, int64_t C) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    embedding_forward_kernel<<<blocks_for(B * T * C), kThreads>>>(static_cast<E*>(out), tokens, static_cast<const E*>(wte),
                                                                  static_cast<const E*>(wpe), T, C, B * T * C);
    return launch_status();
  });
}

size_t embedding_backward_workspace_bytes(int64_t positions) {
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(positions));
  return 3 * static_cast<size_t>(positions) * sizeof(int32_t) + sort_bytes + 256;
}

int embedding_backward(float* dwte, float* dwpe, const void* dout, int kind, const int32_t* tokens, int64_t B,
                       int64_t T, int64_t C, void* workspace, size_t workspace_bytes) {
  const int64_t positions = B * T;
  auto* positions_in = static_cast<int32_t*>(workspace);
  int32_t* sorted_tokens = positions_in + positions;
  int32_t* sorted_positions = sorted_tokens + positions;
  void* sort_storage = sorted_positions + positions;
  size_t sort_bytes = workspace_bytes - 3 * static_cast<size_t>(positions) * sizeof(int32_t);
  iota_kernel<<<blocks_for(positions), kThreads>>>(positions_in, positions);
  cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, tokens, sorted_tokens, positions_in, sorted_positions,
                                  static_cast<int>(positions));
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    const E* grad = static_cast<const E*>(dout);
    embedding_backward_tokens_kernel<<<static_cast<unsigned>(positions), kThreads>>>(dwte, grad, sorted_tokens,
                                                                                    sorted_positions, positions, C);
    embedding_backward_positions_kernel<<<blocks_for(T * C), kThreads>>>(dwpe, grad, B, T, C);
    return launch_status();
  });
}

int layernorm_forward(void* out, float* mean, float* rstd, const void* in, const void* weight, const void* bias,
                      const void* residual, void* residual_out, int kind, int64_t M, int64_t C, float eps) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    layernorm_forward_kernel<<<static_cast<unsigned>(M), kThreads>>>(
        static_cast<E*>(out), mean, rstd, static_cast<const E*>(in), static_cast<const E*>(weight),
        static_cast<const E*>(bias), static_cast<const E*>(residual), static_cast<E*>(residual_out), C, eps);
    return launch_status();
  });
}

int layernorm_backward(void* din, float* dweight, float* dbias, const void* dout, const void* in, const void* weight,
                       int kind, const float* mean, const float* rstd, int64_t M, int64_t C) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    const E* grad = static_cast<const E*>(dout);
    const E* x = static_cast<const E*>(in);
    layernorm_backward_input_kernel<<<static_cast<unsigned>(M), kThreads>>>(
        static_cast<E*>(din), grad, x, static_cast<const E*>(weight), mean, rstd, C);
    layernorm_backward_params_kernel<<<static_cast<unsigned>((C + 31) / 32), dim3(32, kRowGroups)>>>(
        dweight, dbias, grad, x, mean, rstd, M, C);
    return launch_status();
  });
}

int broadcast_rows(void* out, const void* row, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    broadcast_rows_kernel<<<blocks_for(M * N), kThreads>>>(static_cast<E*>(out), static_cast<const E*>(row), N, M * N);
    return launch_status();
  });
}

int column_sums_add(float* sums, const void* in, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    column_sums_add_kernel<<<static_cast<unsigned>((N + 31) / 32), dim3(32, kRowGroups)>>>(
        sums, static_cast<const E*>(in), M, N);
    return launch_status();
  });
}

int gelu_forward(void* out, const void* in, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    gelu_forward_kernel<<<blocks_for(count), kThreads>>>(static_cast<E*>(out), static_cast<const E*>(in), count);
    return launch_status();
  });
}

int gelu_backward(void* din, const void* in, const void* dout, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    gelu_backward_kernel<<<blocks_for(count), kThreads>>>(static_cast<E*>(din), static_cast<const E*>(in),
                                                          static_cast<const E*>(dout), count);
    return launch_status();
  });
}

int residual_forward(void* out, const void* a, const void* b, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    residual_kernel<<<blocks_for(count), kThreads>>>(static_cast<E*>(out), static_cast<const E*>(a),
                                                     static_cast<const E*>(b), count);
    return launch_status();
  });
}

int fill(void* out, int kind, float value, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    fill_kernel<<<blocks_for(count), kThreads>>>(static_cast<E*>(out), value, count);
    return launch_status();
  });
}

int convert(void* out, int out_kind, const void* in, int in_kind, int64_t count) {
  return dispatch(out_kind, [&](auto out_tag) {
    using Out = decltype(out_tag);
    return dispatch(in_kind, [&](auto in_tag) {
      using In = decltype(in_tag);
      convert_kernel<<<blocks_for(count), kThreads>>>(static_cast<Out*>(out), static_cast<const In*>(in), count);
      return launch_status();
    });
  });
}

int attention_softmax_forward(void* scores, float* lse, int kind, const int32_t* key_mask, int64_t B, int64_t NH,
                              int64_t T, bool causal) {
  if (B * NH * T == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    attention_softmax_forward_kernel<<<static_cast<unsigned>(B * NH * T), kThreads>>>(static_cast<E*>(scores), lse,
                                                                                     key_mask, NH, T, causal);
    return launch_status();
  });
}

int attention_softmax_backward(void* scores, void* dscores, const float* lse, const void* dout, const void* out,
                               int kind, const int32_t* key_mask, int64_t B, int64_t NH, int64_t T, int64_t HS,
                               bool causal, float scale) {
  if (B * NH * T == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    attention_softmax_backward_kernel<<<static_cast<unsigned>(B * NH * T), kThreads>>>(
        static_cast<E*>(scores), static_cast<E*>(dscores), lse, static_cast<const E*>(dout),
        static_cast<const E*>(out), key_mask, NH, T, HS, causal, scale);
    return launch_status();
  });
}

int softmax_cross_entropy(void* logits, int kind, float* losses, const int32_t* targets, int64_t M, int64_t V,
                          int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    cross_entropy_kernel<<<static_cast<unsigned>(M), kThreads>>>(static_cast<E*>(logits), losses, targets, V, Vp,
                                                                ignore_index, loss_scale, write_grad);
    return launch_status();
  });
}

int adamw(float* master, void* param_out, int out_kind, const float* grad, float* exp_avg, float* exp_avg_sq,
          int64_t offset, int64_t count, float lr, float beta1, float beta2, float eps, float weight_decay,
          float grad_scale, float bias_correction1, float bias_correction2) {
  if (count == 0) return 0;
  adamw_kernel<<<blocks_for(count), kThreads>>>(master, param_out, out_kind, grad, exp_avg, exp_avg_sq, offset,
                                                count, lr, beta1, beta2, eps, weight_decay, grad_scale,
                                                bias_correction1, bias_correction2);
  return launch_status();
}

int fill_random(void* out, int kind, int64_t count, uint64_t seed) {
  fill_random_kernel<<<blocks_for(count), kThreads>>>(out, kind, count, seed);
  return launch_status();
}

int sum_of_squares(const float* in, int64_t count, double* partials, double* result) {
  sum_squares_partial_kernel<<<kSumBlocks, kThreads>>>(in, count, partials);
  sum_partials_kernel<<<1, 1>>>(partials, kSumBlocks, result);
  return launch_status();
}

}  // namespace kiln::cuda
