// The per-row pieces of the LayerNorm kernels (layernorm.cu, the plain ones; layernorm_fp8.cu, the
// ones that cast for an fp8 product), shared so that every kernel gives the same bits: one warp
// takes a row, lane l the packs of W columns at [W (l + 32 p), W (l + 32 p) + W) for p = 0, 1, ...
// in that order, each lane's terms summed in that order and then across the warp by warp_sum.
// A row is read either from memory pack by pack (any width C) or from a RowPacks a warp loaded
// once into registers (C at most 32 W P); both walk the packs in the same order through the same
// per-pack steps. Every multiply-add is written out (fmaf), so no kernel contracts them its own way.
// Device code only; .cu files include it.
#pragma once

#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {

// The column of pack p of `lane` in a row.
template <int W>
__device__ __forceinline__ int64_t row_column(int lane, int p) {
  return static_cast<int64_t>(W) * (lane + 32 * p);
}

// A row of C columns held by one warp in registers, P packs of W a lane (zeros past the row's
// end): the kernels that would otherwise read it from memory twice (once for the row's sums, once
// for its outputs) read it once.
template <typename T, int W, int P>
struct RowPacks {
  Pack<T, W> packs[P];
  __device__ __forceinline__ void load(const T* row, int64_t C, int lane) {
#pragma unroll
    for (int p = 0; p < P; ++p)
      packs[p] = row_column<W>(lane, p) < C ? Pack<T, W>::load(row + row_column<W>(lane, p)) : Pack<T, W>{};
  }
};

// Asks L2 for the 128-byte lines of a row of `bytes` bytes from `row` on, lane l taking lines l,
// l + 32, ...: the row a warp takes next, so that its loads then wait on L2, not DRAM, while this
// row's work goes on. A hint (prefetch.global.L2): no effect on any result; none on the emulator.
__device__ __forceinline__ void prefetch_row_to_l2(const void* row, int64_t bytes, int lane) {
#if defined(__CUDA_ARCH__)
  const uintptr_t start = reinterpret_cast<uintptr_t>(row), end = start + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = (start & ~uintptr_t{127}) + 128 * lane; line < end; line += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
#else
  (void)row, (void)bytes, (void)lane;
#endif
}

struct RowStatistics {
  float mean, rstd;
};

template <typename T, int W>
__device__ __forceinline__ void add_values(float& sum, const Pack<T, W>& values) {
#pragma unroll
  for (int w = 0; w < W; ++w) sum += values[w];
}

template <typename T, int W>
__device__ __forceinline__ void add_squares(float& squares, const Pack<T, W>& values, float mean) {
#pragma unroll
  for (int w = 0; w < W; ++w) squares = fmaf(values[w] - mean, values[w] - mean, squares);
}

__device__ __forceinline__ RowStatistics statistics_of(float sum_of_squares, float mean, int64_t C, float eps) {
  return {mean, rsqrtf(warp_sum(sum_of_squares) / static_cast<float>(C) + eps)};
}

// The mean and 1 / std of a row, by one warp (every lane gets them), from memory.
template <typename T, int W>
__device__ __forceinline__ RowStatistics row_statistics(const T* x, int64_t C, float eps, int lane) {
  float sum = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) add_values<T, W>(sum, Pack<T, W>::load(x + c));
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) add_squares<T, W>(squares, Pack<T, W>::load(x + c), mean);
  return statistics_of(squares, mean, C, eps);
}

// The same from registers.
template <typename T, int W, int P>
__device__ __forceinline__ RowStatistics row_statistics(const RowPacks<T, W, P>& x, int64_t C, float eps, int lane) {
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (row_column<W>(lane, p) < C) add_values<T, W>(sum, x.packs[p]);
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (row_column<W>(lane, p) < C) add_squares<T, W>(squares, x.packs[p], mean);
  return statistics_of(squares, mean, C, eps);
}

// One normalised element, before rounding to the storage type: one fused multiply-add, written out
// so that every kernel rounds the same way.
__device__ __forceinline__ float normalised(float x, RowStatistics s, float weight, float bias) {
  return fmaf((x - s.mean) * s.rstd, weight, bias);
}

// The backward's per-row values: the forward's statistics and the row's two means, of
// g = dout * weight and of g * xhat (xhat = (x - mean) * rstd).
struct RowGradient {
  float mean, rstd;  // the forward's statistics
  float grad_mean, grad_dot_mean;
};

template <typename T, int W>
__device__ __forceinline__ void add_gradient_terms(float& grad_sum, float& grad_dot, const Pack<T, W>& gradients,
                                                   const Pack<T, W>& values, const Pack<T, W>& scale, float mean,
                                                   float rstd) {
#pragma unroll
  for (int w = 0; w < W; ++w) {
    grad_sum = fmaf(gradients[w], scale[w], grad_sum);
    grad_dot = fmaf(gradients[w] * scale[w] * (values[w] - mean), rstd, grad_dot);
  }
}

__device__ __forceinline__ RowGradient gradient_of(float grad_sum, float grad_dot, float mean, float rstd, int64_t C) {
  return {mean, rstd, warp_sum(grad_sum) / static_cast<float>(C), warp_sum(grad_dot) / static_cast<float>(C)};
}

// A row's RowGradient by one warp (every lane gets it), from memory: g the row of dout, x of the input.
template <typename T, int W>
__device__ __forceinline__ RowGradient row_gradient(const T* g, const T* x, const T* weight, float mean, float rstd,
                                                    int64_t C, int lane) {
  float grad_sum = 0.0f, grad_dot = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W)
    add_gradient_terms<T, W>(grad_sum, grad_dot, Pack<T, W>::load(g + c), Pack<T, W>::load(x + c),
                             Pack<T, W>::load(weight + c), mean, rstd);
  return gradient_of(grad_sum, grad_dot, mean, rstd, C);
}

// The same from registers.
template <typename T, int W, int P>
__device__ __forceinline__ RowGradient row_gradient(const RowPacks<T, W, P>& g, const RowPacks<T, W, P>& x,
                                                    const T* weight, float mean, float rstd, int64_t C, int lane) {
  float grad_sum = 0.0f, grad_dot = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t c = row_column<W>(lane, p);
    if (c < C)
      add_gradient_terms<T, W>(grad_sum, grad_dot, g.packs[p], x.packs[p], Pack<T, W>::load(weight + c), mean, rstd);
  }
  return gradient_of(grad_sum, grad_dot, mean, rstd, C);
}

// din's value for one element, before rounding: rstd (g w - grad_mean - xhat grad_dot_mean), written
// over din, or added to `previous` (din's stored value).
__device__ __forceinline__ float input_gradient(float gradient, float weight, float xhat, const RowGradient& r,
                                                bool write, float previous) {
  const float centred = fmaf(-xhat, r.grad_dot_mean, fmaf(gradient, weight, -r.grad_mean));
  return write ? r.rstd * centred : fmaf(r.rstd, centred, previous);
}

__device__ __forceinline__ float normalised_input(float x, const RowGradient& r) { return (x - r.mean) * r.rstd; }

}  // namespace kiln::cuda
