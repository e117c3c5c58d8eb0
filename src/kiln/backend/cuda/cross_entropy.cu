// Softmax + cross-entropy over the (padded) vocabulary, writing the logits' gradient in place;
// one block per row.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

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

}  // namespace

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

}  // namespace kiln::cuda
