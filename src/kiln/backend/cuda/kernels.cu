// Kernels of the CUDA back-end, first version: correct and deterministic, written plainly.
// Each launcher mirrors the CPU reference op of the same name; the op table (tests/backend)
// checks one against the other. Speed work (fusion, flash attention) replaces these later.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

// ---- embedding -------------------------------------------------------------------------------
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         int64_t T, int64_t C, int64_t count) {
  GRID_STRIDE(i, count) {
    const int64_t position = i / C, c = i % C;
    out[i] = wte[tokens[position] * C + c] + wpe[(position % T) * C + c];
  }
}

// dwte without atomics: positions arrive sorted by token (stable, so in position order within a
// token); the block that starts a run of equal tokens adds the run's rows in order.
__global__ void embedding_backward_tokens_kernel(float* dwte, const float* dout, const int32_t* sorted_tokens,
                                                 const int32_t* sorted_positions, int64_t positions, int64_t C) {
  const int64_t start = blockIdx.x;
  if (start >= positions || (start > 0 && sorted_tokens[start] == sorted_tokens[start - 1])) return;
  const int32_t token = sorted_tokens[start];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = start; i < positions && sorted_tokens[i] == token; ++i) sum += dout[sorted_positions[i] * C + c];
    dwte[token * C + c] += sum;
  }
}

// dwpe[t] += sum over the batch of dout[b, t], in batch order.
__global__ void embedding_backward_positions_kernel(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  GRID_STRIDE(i, T * C) {
    float sum = 0.0f;
    for (int64_t b = 0; b < B; ++b) sum += dout[b * T * C + i];
    dwpe[i] += sum;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t count) {
  GRID_STRIDE(i, count) out[i] = static_cast<int32_t>(i);
}

// ---- layernorm: one block per row ---------------------------------------------------------------
__global__ void layernorm_forward_kernel(float* out, float* mean_out, float* rstd_out, const float* in,
                                         const float* weight, const float* bias, int64_t C, float eps) {
  const int64_t row = blockIdx.x;
  const float* x = in + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += x[c];
  const float mean = block_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) squares += (x[c] - mean) * (x[c] - mean);
  const float rstd = rsqrtf(block_sum(squares) / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = (x[c] - mean) * rstd * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

__global__ void layernorm_backward_input_kernel(float* din, const float* dout, const float* in, const float* weight,
                                                const float* means, const float* rstds, int64_t C) {
  const int64_t row = blockIdx.x;
  const float mean = means[row], rstd = rstds[row];
  const float* x = in + row * C;
  const float* g = dout + row * C;
  float grad_sum = 0.0f, grad_dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gw = g[c] * weight[c];
    grad_sum += gw;
    grad_dot += gw * (x[c] - mean) * rstd;
  }
  const float grad_mean = block_sum(grad_sum) / static_cast<float>(C);
  const float grad_dot_mean = block_sum(grad_dot) / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - mean) * rstd;
    din[row * C + c] += rstd * (g[c] * weight[c] - grad_mean - xhat * grad_dot_mean);
  }
}

// Column sums without atomics, in a fixed order: a block owns 32 columns; its kRowGroups warps
// stride over the rows (coalesced 128-byte reads per row), then the partial sums are added in
// row-group order through shared memory.
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

__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout, const float* in,
                                                 const float* means, const float* rstds, int64_t M, int64_t C) {
  column_sums(dweight, dbias, M, C, [=] __device__(int64_t m, int64_t c) {
    const float g = dout[m * C + c];
    return make_float2(g * (in[m * C + c] - means[m]) * rstds[m], g);
  });
}

// ---- bias helpers, elementwise ----------------------------------------------------------------------
__global__ void broadcast_rows_kernel(float* out, const float* row, int64_t N, int64_t count) {
  GRID_STRIDE(i, count) out[i] = row[i % N];
}

__global__ void column_sums_add_kernel(float* sums, const float* in, int64_t M, int64_t N) {
  column_sums(sums, nullptr, M, N, [=] __device__(int64_t m, int64_t n) { return make_float2(in[m * N + n], 0.0f); });
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = in[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float* din, const float* in, const float* dout, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = in[i];
    const float tanh_inner = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float sech_squared = 1.0f - tanh_inner * tanh_inner;
    const float local = 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] = local * dout[i];
  }
}

__global__ void residual_kernel(float* out, const float* a, const float* b, int64_t count) {
  GRID_STRIDE(i, count) out[i] = a[i] + b[i];
}

__global__ void fill_kernel(float* out, float value, int64_t count) {
  GRID_STRIDE(i, count) out[i] = value;
}

// ---- attention softmax: one block per row of scores -------------------------------------------------
__global__ void masked_softmax_kernel(float* scores, const int32_t* key_mask, int64_t NH, int64_t T, bool causal) {
  const int64_t row = blockIdx.x;  // (b * NH + h) * T + t
  const int64_t t = row % T, b = row / (NH * T);
  float* s = scores + row * T;
  const int64_t last_key = causal ? t : T - 1;
  float max_score = -INFINITY;
  for (int64_t k = threadIdx.x; k < T; k += blockDim.x) {
    const bool visible = k <= last_key && (key_mask == nullptr || key_mask[b * T + k] != 0);
    if (!visible) s[k] = -INFINITY;
    max_score = fmaxf(max_score, s[k]);
  }
  max_score = block_max(max_score);
  if (max_score == -INFINITY) {
    for (int64_t k = threadIdx.x; k < T; k += blockDim.x) s[k] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < T; k += blockDim.x) {
    s[k] = expf(s[k] - max_score);
    sum += s[k];
  }
  const float inverse_sum = 1.0f / block_sum(sum);
  for (int64_t k = threadIdx.x; k < T; k += blockDim.x) s[k] *= inverse_sum;
}

__global__ void softmax_backward_kernel(float* dscores, const float* probs, int64_t T, float scale) {
  const int64_t row = blockIdx.x;
  float* ds = dscores + row * T;
  const float* p = probs + row * T;
  float weighted = 0.0f;
  for (int64_t k = threadIdx.x; k < T; k += blockDim.x) weighted += p[k] * ds[k];
  weighted = block_sum(weighted);
  for (int64_t k = threadIdx.x; k < T; k += blockDim.x) ds[k] = p[k] * (ds[k] - weighted) * scale;
}

// ---- cross-entropy: one block per row ---------------------------------------------------------------
__global__ void cross_entropy_kernel(float* logits, float* losses, const int32_t* targets, int64_t V, int64_t Vp,
                                     int32_t ignore_index, float loss_scale, bool write_grad) {
  const int64_t row = blockIdx.x;
  float* x = logits + row * Vp;
  const int32_t target = targets[row];
  const bool ignored = target == ignore_index;
  float max_logit = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) max_logit = fmaxf(max_logit, x[v]);
  max_logit = block_max(max_logit);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - max_logit);
  const float log_sum = logf(block_sum(sum)) + max_logit;
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : log_sum - x[target];
  if (!write_grad) return;
  __syncthreads();  // the loss read x[target] before it is overwritten
  for (int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    float grad = 0.0f;
    if (!ignored && v < V) grad = (expf(x[v] - log_sum) - (v == target ? 1.0f : 0.0f)) * loss_scale;
    x[v] = grad;
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
    if (out_kind == 0) static_cast<float*>(param_out)[i] = master[i];
    if (out_kind == 1) static_cast<__nv_bfloat16*>(param_out)[i] = __float2bfloat16_rn(master[i]);
    if (out_kind == 2) static_cast<__half*>(param_out)[i] = __float2half_rn(master[i]);
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
    if (kind == 0) static_cast<float*>(out)[i] = value;
    if (kind == 1) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(value);
    if (kind == 2) static_cast<__half*>(out)[i] = __float2half_rn(value);
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

int embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                      int64_t C) {
  embedding_forward_kernel<<<blocks_for(B * T * C), kThreads>>>(out, tokens, wte, wpe, T, C, B * T * C);
  return launch_status();
}

size_t embedding_backward_workspace_bytes(int64_t positions) {
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(positions));
  return 3 * static_cast<size_t>(positions) * sizeof(int32_t) + sort_bytes + 256;
}

int embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                       int64_t C, void* workspace, size_t workspace_bytes) {
  const int64_t positions = B * T;
  auto* positions_in = static_cast<int32_t*>(workspace);
  int32_t* sorted_tokens = positions_in + positions;
  int32_t* sorted_positions = sorted_tokens + positions;
  void* sort_storage = sorted_positions + positions;
  size_t sort_bytes = workspace_bytes - 3 * static_cast<size_t>(positions) * sizeof(int32_t);
  iota_kernel<<<blocks_for(positions), kThreads>>>(positions_in, positions);
  cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, tokens, sorted_tokens, positions_in, sorted_positions,
                                  static_cast<int>(positions));
  embedding_backward_tokens_kernel<<<static_cast<unsigned>(positions), kThreads>>>(dwte, dout, sorted_tokens,
                                                                                  sorted_positions, positions, C);
  embedding_backward_positions_kernel<<<blocks_for(T * C), kThreads>>>(dwpe, dout, B, T, C);
  return launch_status();
}

int layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                      int64_t M, int64_t C, float eps) {
  if (M == 0) return 0;
  layernorm_forward_kernel<<<static_cast<unsigned>(M), kThreads>>>(out, mean, rstd, in, weight, bias, C, eps);
  return launch_status();
}

int layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                       const float* weight, const float* mean, const float* rstd, int64_t M, int64_t C) {
  if (M == 0) return 0;
  layernorm_backward_input_kernel<<<static_cast<unsigned>(M), kThreads>>>(din, dout, in, weight, mean, rstd, C);
  layernorm_backward_params_kernel<<<static_cast<unsigned>((C + 31) / 32), dim3(32, kRowGroups)>>>(
      dweight, dbias, dout, in, mean, rstd, M, C);
  return launch_status();
}

int broadcast_rows(float* out, const float* row, int64_t M, int64_t N) {
  broadcast_rows_kernel<<<blocks_for(M * N), kThreads>>>(out, row, N, M * N);
  return launch_status();
}

int column_sums_add(float* sums, const float* in, int64_t M, int64_t N) {
  column_sums_add_kernel<<<static_cast<unsigned>((N + 31) / 32), dim3(32, kRowGroups)>>>(sums, in, M, N);
  return launch_status();
}

int gelu_forward(float* out, const float* in, int64_t count) {
  gelu_forward_kernel<<<blocks_for(count), kThreads>>>(out, in, count);
  return launch_status();
}

int gelu_backward(float* din, const float* in, const float* dout, int64_t count) {
  gelu_backward_kernel<<<blocks_for(count), kThreads>>>(din, in, dout, count);
  return launch_status();
}

int residual_forward(float* out, const float* a, const float* b, int64_t count) {
  residual_kernel<<<blocks_for(count), kThreads>>>(out, a, b, count);
  return launch_status();
}

int fill(float* out, float value, int64_t count) {
  fill_kernel<<<blocks_for(count), kThreads>>>(out, value, count);
  return launch_status();
}

int masked_softmax(float* scores, const int32_t* key_mask, int64_t B, int64_t NH, int64_t T, bool causal) {
  if (B * NH * T == 0) return 0;
  masked_softmax_kernel<<<static_cast<unsigned>(B * NH * T), kThreads>>>(scores, key_mask, NH, T, causal);
  return launch_status();
}

int softmax_backward(float* dscores, const float* probs, int64_t rows, int64_t T, float scale) {
  if (rows == 0) return 0;
  softmax_backward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(dscores, probs, T, scale);
  return launch_status();
}

int softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t M, int64_t V, int64_t Vp,
                          int32_t ignore_index, float loss_scale, bool write_grad) {
  if (M == 0) return 0;
  cross_entropy_kernel<<<static_cast<unsigned>(M), kThreads>>>(logits, losses, targets, V, Vp, ignore_index,
                                                              loss_scale, write_grad);
  return launch_status();
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
