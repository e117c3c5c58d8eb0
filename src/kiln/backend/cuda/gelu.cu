// GELU, tanh form (Hendrycks & Gimpel 2016, as GPT-2), forward and backward, elementwise; used where
// the product before or after it cannot take cuBLASLt's GELU epilogues (matmul.cpp).
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* in, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = to_float(in[i]);
    out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* din, const T* in, const T* dout, int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = to_float(in[i]);
    const float tanh_inner = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float sech_squared = 1.0f - tanh_inner * tanh_inner;
    const float local = 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] = from_float<T>(local * to_float(dout[i]));
  }
}

}  // namespace

int gelu_forward(void* out, const void* in, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(gelu_forward_kernel<E>, blocks_for(count), kThreads, 0, static_cast<E*>(out),
           static_cast<const E*>(in), count);
    return launch_status();
  });
}

int gelu_backward(void* din, const void* in, const void* dout, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(gelu_backward_kernel<E>, blocks_for(count), kThreads, 0, static_cast<E*>(din),
           static_cast<const E*>(in), static_cast<const E*>(dout), count);
    return launch_status();
  });
}

}  // namespace kiln::cuda
