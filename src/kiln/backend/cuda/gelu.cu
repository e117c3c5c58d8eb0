// GELU, tanh form (gelu.cuh), forward and backward, elementwise; used where the product before or
// after it cannot take cuBLASLt's GELU epilogues (cuda_backend.cpp).
#include "kiln/backend/cuda/gelu.cuh"
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// W elements at a time (Pack, element.cuh); count is a multiple of W.
template <typename T, int W>
__global__ void gelu_forward_kernel(T* out, const T* in, int64_t count) {
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(in + p * W);
    Pack<T, W> y;
#pragma unroll
    for (int w = 0; w < W; ++w)
      y.set(w, gelu(x[w]));
    y.store(out + p * W);
  }
}

template <typename T, int W>
__global__ void gelu_backward_kernel(T* din, const T* in, const T* dout, int64_t count) {
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(in + p * W), g = Pack<T, W>::load(dout + p * W);
    Pack<T, W> d;
#pragma unroll
    for (int w = 0; w < W; ++w) d.set(w, gelu_derivative(x[w]) * g[w]);
    d.store(din + p * W);
  }
}

}  // namespace

int gelu_forward(void* out, const void* in, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out, in}, [&](auto width) {
      launch(gelu_forward_kernel<E, decltype(width)::value>,
             blocks_for(count / decltype(width)::value), kThreads, 0, static_cast<E*>(out),
             static_cast<const E*>(in), count);
      return launch_status();
    });
  });
}

int gelu_backward(void* din, const void* in, const void* dout, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {din, in, dout}, [&](auto width) {
      launch(gelu_backward_kernel<E, decltype(width)::value>,
             blocks_for(count / decltype(width)::value), kThreads, 0, static_cast<E*>(din),
             static_cast<const E*>(in), static_cast<const E*>(dout), count);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
