// GELU, tanh form (gelu.cuh), forward and backward, elementwise (elementwise_map.cuh); used where
// the product before or after it cannot take cuBLASLt's GELU epilogues (cuda_backend.cpp).
#include "kiln/backend/cuda/elementwise_map.cuh"
#include "kiln/backend/cuda/gelu.cuh"

namespace kiln::cuda {
namespace {

struct GeluOf {
  static constexpr int kInputs = 1;
  __device__ __forceinline__ float operator()(float x) const { return gelu(x); }
};
struct GeluGradient {  // from the forward's input x and the output gradient g
  static constexpr int kInputs = 2;
  __device__ __forceinline__ float operator()(float x, float g) const { return gelu_derivative(x) * g; }
};

}  // namespace

int gelu_forward(void* out, const void* in, int kind, int64_t count) {
  return map_elements(out, in, nullptr, kind, count, GeluOf{});
}

int gelu_backward(void* din, const void* in, const void* dout, int kind, int64_t count) {
  return map_elements(din, in, dout, kind, count, GeluGradient{});
}

}  // namespace kiln::cuda
