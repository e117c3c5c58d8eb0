// The optimizer's kernels: AdamW over flat fp32 buffers with the rounded parameters written in the
// same pass, and the gradient's sum of squares (global norm, inf/NaN check) in a fixed order.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// AdamW's ranges go in one launch, not one each: a GPT-2 step has about eight ranges a layer
// (weights with decay; biases and LayerNorms without), half of them a few blocks' worth of elements
// (1024 a block), so a launch each made about a hundred kernels, most too small to fill the GPU.
// A table of up to kRangesPerLaunch ranges travels in the kernel's parameters (1.5 KB, within
// their 4 KB); each range has blocks of its own, so a block finds its range by a search all its
// threads make alike.
constexpr int kRangesPerLaunch = 64;
struct RangeTable {
  int64_t begin[kRangesPerLaunch], end[kRangesPerLaunch];  // elements [begin, end)
  float weight_decay[kRangesPerLaunch];
  int first_block[kRangesPerLaunch];  // range r's blocks start at first_block[r], ascending
  int size;
};

// One element's update (ops.h, AdamwStep), with 1 / (1 - beta^step) folded in by the host: returns
// the new master value and updates m and v.
__device__ __forceinline__ float adamw_element(float master, float grad, float& m, float& v, float decay,
                                               const AdamwScalars& s) {
  const float g = grad * s.grad_scale;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float m_hat = m * s.inverse_correction1, v_hat = v * s.inverse_correction2;
  return master - s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + decay * master);
}

// Thread t of block k of range r takes the W elements from W (floor(begin / W) + k kThreads + t):
// one pack of each buffer (16-byte fp32 accesses where W = 4) when all W lie in the range, else
// those that do one at a time. T is param_out's storage type.
template <typename T, int W>
__global__ void adamw_kernel(float* master, T* param_out, const float* grad, float* exp_avg, float* exp_avg_sq,
                             const __grid_constant__ RangeTable table, AdamwScalars scalars) {
  const int block = static_cast<int>(blockIdx.x);
  int r = 0;
  for (int step = kRangesPerLaunch / 2; step > 0; step /= 2)  // the last range starting at or before block
    if (r + step < table.size && table.first_block[r + step] <= block) r += step;
  const int64_t begin = table.begin[r], end = table.end[r];
  const int64_t first = (begin / W + static_cast<int64_t>(block - table.first_block[r]) * kThreads + threadIdx.x) * W;
  if (first >= end) return;
  const float decay = table.weight_decay[r];
  if (first >= begin && first + W <= end) {
    using F = Pack<float, W>;
    F w = F::load(master + first), m = F::load(exp_avg + first), v = F::load(exp_avg_sq + first);
    const F g = F::load(grad + first);
    Pack<T, W> out;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float mi = m[i], vi = v[i];
      const float updated = adamw_element(w[i], g[i], mi, vi, decay, scalars);
      m.set(i, mi);
      v.set(i, vi);
      w.set(i, updated);
      out.set(i, updated);
    }
    m.store(exp_avg + first);
    v.store(exp_avg_sq + first);
    w.store(master + first);
    out.store(param_out + first);
    return;
  }
  for (int64_t i = first > begin ? first : begin; i < first + W && i < end; ++i) {
    const float updated = adamw_element(master[i], grad[i], exp_avg[i], exp_avg_sq[i], decay, scalars);
    master[i] = updated;
    param_out[i] = from_float<T>(updated);
  }
}

// Launches adamw_kernel<T, W> over the ranges, kRangesPerLaunch at a time (empty ones skipped).
template <typename T, int W>
int adamw_launches(float* master, T* param_out, const float* grad, float* exp_avg, float* exp_avg_sq,
                   const AdamwRange* ranges, int64_t range_count, const AdamwScalars& scalars) {
  RangeTable table{};
  int blocks = 0;
  const auto flush = [&] {
    if (table.size == 0) return 0;
    launch(adamw_kernel<T, W>, static_cast<unsigned>(blocks), kThreads, 0, master, param_out, grad, exp_avg,
           exp_avg_sq, table, scalars);
    table.size = blocks = 0;
    return launch_status();
  };
  for (int64_t r = 0; r < range_count; ++r) {
    const int64_t begin = ranges[r].offset, end = begin + ranges[r].count;
    if (begin == end) continue;
    table.begin[table.size] = begin;
    table.end[table.size] = end;
    table.weight_decay[table.size] = ranges[r].weight_decay;
    table.first_block[table.size] = blocks;
    // an int: 2^31 blocks would cover 2^39 elements or more, 2 TB of each fp32 buffer
    blocks += static_cast<int>(((end + W - 1) / W - begin / W + kThreads - 1) / kThreads);
    if (++table.size == kRangesPerLaunch)
      if (const int status = flush()) return status;
  }
  return flush();
}

// The sum of squares in two steps of fixed shape, so the result depends only on count and W: block b
// of kSumBlocks adds the squares of its threads' packs (W floats, 16 bytes where the buffer is
// 16-byte aligned: thread t takes packs t, t + threads, ..., loading kSquaresInFlight before adding
// any; the elements past the last whole pack go to the first threads) in a fixed tree into
// partials[b], then one warp adds the partials. One 4-byte load at a time a thread, as before, kept
// about 4 KB in flight an SM, far from what DRAM's latency needs for its bandwidth (tens of KB).
constexpr int kSquaresInFlight = 4;

template <int W>
__global__ void sum_squares_partial_kernel(const float* in, int64_t count, double* partials) {
  using P = Pack<float, W>;
  __shared__ double shared[kThreads];
  const int64_t packs = count / W, threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t thread = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  double sum = 0.0;
  for_each_pack<kSquaresInFlight, W>(in, thread * W, threads * W, packs * W, [&](const P& values, int64_t) {
#pragma unroll
    for (int w = 0; w < W; ++w) sum += static_cast<double>(values[w]) * values[w];
  });
  if (packs * W + thread < count) sum += static_cast<double>(in[packs * W + thread]) * in[packs * W + thread];
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// One warp: lane l adds partials l, l + 32, ... in order, then the lanes' sums in a fixed butterfly.
__global__ void sum_partials_kernel(const double* partials, int count, double* result) {
  double total = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += 32) total += partials[i];
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
  if (threadIdx.x == 0) *result = total;
}

}  // namespace

int adamw(float* master, void* param_out, int out_kind, const float* grad, float* exp_avg, float* exp_avg_sq,
          const AdamwRange* ranges, int64_t range_count, const AdamwScalars& scalars) {
  const bool floats_packed = aligned_to(16, {master, grad, exp_avg, exp_avg_sq});
  return dispatch(out_kind, [&](auto tag) {
    using T = decltype(tag);
    auto* out = static_cast<T*>(param_out);
    return floats_packed && aligned_to(4 * sizeof(T), {param_out})
               ? adamw_launches<T, 4>(master, out, grad, exp_avg, exp_avg_sq, ranges, range_count, scalars)
               : adamw_launches<T, 1>(master, out, grad, exp_avg, exp_avg_sq, ranges, range_count, scalars);
  });
}

int sum_of_squares(const float* in, int64_t count, double* partials, double* result) {
  if (aligned_to(16, {in}))
    launch(sum_squares_partial_kernel<4>, kSumBlocks, kThreads, 0, in, count, partials);
  else
    launch(sum_squares_partial_kernel<1>, kSumBlocks, kThreads, 0, in, count, partials);
  launch(sum_partials_kernel, 1, 32, 0, partials, kSumBlocks, result);
  return launch_status();
}

}  // namespace kiln::cuda
