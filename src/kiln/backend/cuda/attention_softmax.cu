// Attention's softmax for the general (cuBLASLt) attention path under the flash-attention contract
// (ops.h): forward turns scaled scores into probabilities and the log-sum-exp; backward recomputes
// P from lse and forms dS. One block per row (b, h, t). With attention dropout (ops.h) the forward
// leaves P Z for the product with v, and the backward dS = P (dP Z - D) scale and P Z for dv. The
// fused paths are flash_attention.h and general_attention.h.
#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/backend/dropout_mask.h"

namespace kiln::cuda {
namespace {

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
                                                 int64_t T_, bool causal, DropoutMask dropout) {
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
  for (int64_t k = threadIdx.x; k < T_; k += blockDim.x) {
    const float p = visible(k) ? expf(to_float(s[k]) - max_score) * inverse_sum : 0.0f;
    s[k] = from_float<T>(dropout.threshold ? p * dropout.factor(static_cast<uint64_t>(row * T_ + k)) : p);
  }
  if (threadIdx.x == 0) lse[row] = max_score + logf(sum);
}

template <typename T>
__global__ void attention_softmax_backward_kernel(T* scores, T* dscores, const float* lse, const T* dout, const T* out,
                                                  const int32_t* key_mask, int64_t NH, int64_t T_, int64_t HS,
                                                  bool causal, float scale, DropoutMask dropout) {
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
    const float z = dropout.threshold ? dropout.factor(static_cast<uint64_t>(row * T_ + k)) : 1.0f;
    s[k] = from_float<T>(p * z);
    ds[k] = from_float<T>(p * (to_float(ds[k]) * z - row_dot) * scale);
  }
}

}  // namespace

int attention_softmax_forward(void* scores, float* lse, int kind, const int32_t* key_mask, int64_t B, int64_t NH,
                              int64_t T, bool causal, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(attention_softmax_forward_kernel<E>, static_cast<unsigned>(B * NH * T), kThreads, 0,
           static_cast<E*>(scores), lse, key_mask, NH, T, causal, dropout);
    return launch_status();
  });
}

int attention_softmax_backward(void* scores, void* dscores, const float* lse, const void* dout, const void* out,
                               int kind, const int32_t* key_mask, int64_t B, int64_t NH, int64_t T, int64_t HS,
                               bool causal, float scale, const DropoutMask& dropout) {
  if (B * NH * T == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(attention_softmax_backward_kernel<E>, static_cast<unsigned>(B * NH * T), kThreads, 0,
           static_cast<E*>(scores), static_cast<E*>(dscores), lse, static_cast<const E*>(dout),
           static_cast<const E*>(out), key_mask, NH, T, HS, causal, scale, dropout);
    return launch_status();
  });
}

}  // namespace kiln::cuda
