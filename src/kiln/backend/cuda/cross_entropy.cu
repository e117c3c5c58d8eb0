// Softmax + cross-entropy over the (padded) vocabulary, writing the logits' gradient in place;
// one block per row, two passes over it (online softmax, then the gradient) instead of three,
// 16 bytes at a time where the padded row allows.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// 1024 threads a block, two blocks an SM: the rows being read at once (264 on an H100's 132 SMs,
// 26 MB at GPT-2's 50,304 bf16 columns) fit the 50 MB L2, so the gradient pass reads its row
// again from L2, not DRAM. With 256-thread blocks, eight an SM, the 1,056 rows in flight (105 MB)
// did not fit, and much of the second pass went to DRAM.
constexpr int kRowThreads = 1024;

// The running (max, sum of exp(x - max)) of an online softmax (Milakov & Gimelshein 2018), so one
// read of the row gives both; merging two states rescales the smaller maximum's sum.
struct SoftmaxState {
  float max = -INFINITY, sum = 0.0f;
  __device__ void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;
      max = x;
    } else if (x != -INFINITY) {
      sum += expf(x - max);
    }
  }
  __device__ void merge(float other_max, float other_sum) {
    const float merged = fmaxf(max, other_max);
    if (merged == -INFINITY) return;  // both empty
    sum = sum * expf(max - merged) + other_sum * expf(other_max - merged);
    max = merged;
  }
};

// Block-wide merge for blockDim.x == kRowThreads; every thread gets the result.
__device__ SoftmaxState block_merge(SoftmaxState state) {
  __shared__ float maxes[kRowThreads / 32], sums[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1)
    state.merge(__shfl_xor_sync(0xffffffffu, state.max, offset), __shfl_xor_sync(0xffffffffu, state.sum, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    maxes[warp] = state.max;
    sums[warp] = state.sum;
  }
  __syncthreads();
  SoftmaxState total;
  for (int w = 0; w < kRowThreads / 32; ++w) total.merge(maxes[w], sums[w]);  // same order in every thread
  return total;
}

// Two passes over the row: the online softmax state, then (with write_grad) the gradient. W
// elements at a time (Pack, element.cuh; Vp is a multiple of W, so a pack never leaves the row).
template <typename T, int W>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int64_t V,
                                     int64_t Vp, int32_t ignore_index, float loss_scale,
                                     bool write_grad) {
  using P = Pack<T, W>;
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int32_t target = targets[row];
  const bool ignored = target == ignore_index;
  SoftmaxState state;
  for (int64_t v = threadIdx.x * W; v < V; v += blockDim.x * W) {
    const P values = P::load(x + v);
#pragma unroll
    for (int w = 0; w < W; ++w)
      if (v + w < V) state.add(values[w]);
  }
  state = block_merge(state);
  const float log_sum = logf(state.sum) + state.max;
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : log_sum - to_float(x[target]);
  if (!write_grad) return;
  __syncthreads();  // the loss read x[target] before it is overwritten
  for (int64_t v = threadIdx.x * W; v < Vp; v += blockDim.x * W) {
    const P values = P::load(x + v);
    P gradients;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      float grad = 0.0f;
      if (!ignored && v + w < V)
        grad = (expf(values[w] - log_sum) - (v + w == target ? 1.0f : 0.0f)) * loss_scale;
      gradients.set(w, grad);
    }
    gradients.store(x + v);
  }
}

}  // namespace

int softmax_cross_entropy(void* logits, int kind, float* losses, const int32_t* targets, int64_t M, int64_t V,
                          int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(Vp, {logits}, [&](auto width) {
      launch(cross_entropy_kernel<E, decltype(width)::value>, static_cast<unsigned>(M), kRowThreads, 0,
             static_cast<E*>(logits), losses, targets, V, Vp, ignore_index, loss_scale, write_grad);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
