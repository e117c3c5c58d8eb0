// tanh (ops.h), forward and backward, elementwise (elementwise_map.cuh): the backward reads the
// forward's output, din = dout (1 - out^2).
#include "kiln/backend/cuda/elementwise_map.cuh"

namespace kiln::cuda {
namespace {

struct TanhOf {
  static constexpr int kInputs = 1;
  __device__ __forceinline__ float operator()(float x) const { return tanhf(x); }
};
struct TanhGradient {  // from the forward's output y and the output gradient g
  static constexpr int kInputs = 2;
  __device__ __forceinline__ float operator()(float y, float g) const { return g * (1.0f - y * y); }
};

}  // namespace

int tanh_forward(void* out, const void* in, int kind, int64_t count) {
  return map_elements(out, in, nullptr, kind, count, TanhOf{});
}

int tanh_backward(void* din, const void* out, const void* dout, int kind, int64_t count) {
  return map_elements(din, out, dout, kind, count, TanhGradient{});
}

}  // namespace kiln::cuda
