// Element access for the CUDA kernels: every storage type (fp32, bf16, fp16) is read into fp32 and
// rounded to nearest even once on store. Device code only; included by the .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kiln::cuda {

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
__device__ __forceinline__ float to_float(__half value) { return __half2float(value); }

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) { return value; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }
template <>
__device__ __forceinline__ __half from_float<__half>(float value) { return __float2half_rn(value); }

}  // namespace kiln::cuda
