// Dropout (ops.h): each element's keep bit from Philox (core/philox.h), the same bits the CPU
// reference draws, so forward, recomputed forward and backward share one mask stored nowhere.
#include "kiln/backend/cuda/kernel_common.cuh"
#include "kiln/core/philox.h"

namespace kiln::cuda {
namespace {

// W elements at a time (Pack, element.cuh); count is a multiple of W.
template <typename T, int W>
__global__ void dropout_kernel(T* out, const T* in, int64_t count, uint64_t threshold, float scale, uint64_t seed,
                               uint64_t stream) {
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(in + p * W);
    Pack<T, W> y;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const uint64_t index = static_cast<uint64_t>(p) * W + w;
      y.set(w, philox::bits(seed, stream, index) >= threshold ? x[w] * scale : 0.0f);
    }
    y.store(out + p * W);
  }
}

}  // namespace

int dropout(void* out, const void* in, int kind, int64_t count, uint64_t threshold, float scale, uint64_t seed,
            uint64_t stream) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out, in}, [&](auto width) {
      launch(dropout_kernel<E, decltype(width)::value>, blocks_for(count / decltype(width)::value), kThreads, 0,
             static_cast<E*>(out), static_cast<const E*>(in), count, threshold, scale, seed, stream);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
