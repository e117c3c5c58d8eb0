// Dropout (ops.h): each element's keep bit from Philox (core/philox.h), the same bits the CPU
// reference draws, so forward, recomputed forward and backward share one mask stored nowhere.
// With a residual, the residual stream's fused dropout-add.
#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/core/philox.h"

namespace kiln::cuda {
namespace {

// W elements at a time (Pack, element.cuh); count is a multiple of W. A pack of W >= 4 elements
// (16 bytes) starts on a multiple of 4, so one Philox block gives four elements' bits.
template <typename T, int W>
__global__ void dropout_kernel(T* out, const T* in, const T* residual, int64_t count, uint64_t threshold, float scale,
                               uint64_t seed, uint64_t stream) {
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(in + p * W);
    Pack<T, W> y;
    if (residual) y = Pack<T, W>::load(residual + p * W);
#pragma unroll
    for (int w = 0; w < W; w += (W >= 4 ? 4 : 1)) {
      const uint64_t first = static_cast<uint64_t>(p) * W + w;
      // p = 0 (an add with a residual) keeps everything: no bits to draw.
      const philox::Words bits = threshold == 0 ? philox::Words{} : philox::block(seed, stream, first >> 2);
#pragma unroll
      for (int k = 0; k < (W >= 4 ? 4 : 1); ++k) {
        const uint32_t draw = W >= 4 ? bits.w[k] : bits.w[first & 3];
        const float kept = draw >= threshold ? x[w + k] * scale : 0.0f;
        y.set(w + k, residual ? y[w + k] + kept : kept);
      }
    }
    y.store(out + p * W);
  }
}

}  // namespace

int dropout(void* out, const void* in, const void* residual, int kind, int64_t count, uint64_t threshold, float scale,
            uint64_t seed, uint64_t stream) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out, in, residual}, [&](auto width) {
      launch(dropout_kernel<E, decltype(width)::value>, blocks_for(count / decltype(width)::value), kThreads, 0,
             static_cast<E*>(out), static_cast<const E*>(in), static_cast<const E*>(residual), count, threshold,
             scale, seed, stream);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
