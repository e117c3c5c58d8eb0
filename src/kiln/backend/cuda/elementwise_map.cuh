// The elementwise ops' one kernel shape: out[i] = f(a[i]), or f(a[i], b[i]) with a second input
// (GELU, tanh and their backward), W elements a pack (element.cuh), in fp32 and rounded once on
// store. `f` is a functor with a __device__ operator() of F::kInputs floats (1 or 2); its name is
// in the kernel's, so a profile (launch_timing.h) tells the ops apart: "map_kernel<bf16, 8, TanhOf>".
// Device code and the launcher; .cu files include it.
#pragma once

#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {

// count is a multiple of W; b is read only when F takes two values.
template <typename T, int W, typename F>
__global__ void map_kernel(T* out, const T* a, const T* b, int64_t count, F f) {
  static_assert(F::kInputs == 1 || F::kInputs == 2);
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(a + p * W);
    Pack<T, W> y;
    if constexpr (F::kInputs == 2) {
      const auto z = Pack<T, W>::load(b + p * W);
#pragma unroll
      for (int w = 0; w < W; ++w) y.set(w, f(x[w], z[w]));
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) y.set(w, f(x[w]));
    }
    y.store(out + p * W);
  }
}

// out = f(a) (b null) or f(a, b) (F::kInputs 2) over `count` elements of the element kind `kind`
// (kernels.h), in packs where the count and all pointers allow; out may alias a or b. Returns the
// launch status.
template <typename F>
int map_elements(void* out, const void* a, const void* b, int kind, int64_t count, F f) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out, a, b}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(map_kernel<E, W, F>, blocks_for(count / W), kThreads, 0, static_cast<E*>(out),
             static_cast<const E*>(a), static_cast<const E*>(b), count, f);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
