// The optimizer's kernels: AdamW over flat fp32 buffers with the rounded parameters written in the
// same pass, and the gradient's sum of squares (global norm, inf/NaN check) in a fixed order.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

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

__global__ void sum_squares_partial_kernel(const float* in, int64_t count, double* partials) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  GRID_STRIDE(i, count) sum += static_cast<double>(in[i]) * in[i];
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
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

int adamw(float* master, void* param_out, int out_kind, const float* grad, float* exp_avg, float* exp_avg_sq,
          int64_t offset, int64_t count, float lr, float beta1, float beta2, float eps, float weight_decay,
          float grad_scale, float bias_correction1, float bias_correction2) {
  if (count == 0) return 0;
  launch(adamw_kernel, blocks_for(count), kThreads, 0, master, param_out, out_kind, grad, exp_avg,
         exp_avg_sq, offset, count, lr, beta1, beta2, eps, weight_decay, grad_scale,
         bias_correction1, bias_correction2);
  return launch_status();
}

int sum_of_squares(const float* in, int64_t count, double* partials, double* result) {
  launch(sum_squares_partial_kernel, kSumBlocks, kThreads, 0, in, count, partials);
  launch(sum_partials_kernel, 1, 1, 0, partials, kSumBlocks, result);
  return launch_status();
}

}  // namespace kiln::cuda
