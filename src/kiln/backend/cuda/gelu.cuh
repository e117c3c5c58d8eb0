// GELU, tanh form (Hendrycks & Gimpel 2016, as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// One definition for every kernel that computes it or its derivative (the GELU ops, the casts of a
// GELU output or of a gradient through GELU for an fp8 product), so they give the same bits.
// Device code only; .cu files include it.
#pragma once

#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_tanh_inner(float x) {
  return tanhf(kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x));
}

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + gelu_tanh_inner(x)); }

// d gelu(x) / dx.
__device__ __forceinline__ float gelu_derivative(float x) {
  const float tanh_inner = gelu_tanh_inner(x);
  const float sech_squared = 1.0f - tanh_inner * tanh_inner;
  return 0.5f * (1.0f + tanh_inner) +
         0.5f * x * sech_squared * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

}  // namespace kiln::cuda
