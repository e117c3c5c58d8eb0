// Element access for the CUDA kernels: every storage type (fp32, bf16, fp16) is read into fp32 and
// rounded to nearest even once on store; packs of elements for the memory-bound kernels. Device
// code (and aligned_to and packs_fit, host helpers); included by the .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

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

// W consecutive elements moved as one access: with W = kPackWidth<T> a 16-byte load or store, so a
// warp moves 512 bytes per instruction instead of 64 (2-byte elements one at a time leave most of
// the memory bandwidth unused). W = 1 is the plain element access, for extents or pointers that do
// not allow packs (packs_fit). Values pass through fp32 as everywhere else.
template <typename T>
constexpr int kPackWidth = 16 / static_cast<int>(sizeof(T));

template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T values[W];
  __device__ __forceinline__ static Pack load(const T* at) {
    return *reinterpret_cast<const Pack*>(at);
  }
  __device__ __forceinline__ void store(T* at) const { *reinterpret_cast<Pack*>(at) = *this; }
  __device__ __forceinline__ float operator[](int i) const { return to_float(values[i]); }
  __device__ __forceinline__ void set(int i, float value) { values[i] = from_float<T>(value); }
};

// Whether every pointer is aligned to `bytes` (host side).
inline bool aligned_to(size_t bytes, std::initializer_list<const void*> pointers) {
  for (const void* pointer : pointers)
    if (reinterpret_cast<uintptr_t>(pointer) % bytes != 0) return false;
  return true;
}

// Whether every row of `extent` elements of T at each pointer starts 16-byte aligned, so that
// 16-byte packs tile the rows exactly (host side).
template <typename T>
inline bool packs_fit(int64_t extent, std::initializer_list<const void*> pointers) {
  return extent % kPackWidth<T> == 0 && aligned_to(16, pointers);
}

}  // namespace kiln::cuda
