// Stands in for the CUDA runtime header when a host compiler builds kiln's kernels for the CPU
// emulator (cuda_emulator.h). First on the include path of kiln_emulated_cuda only, so the .cu
// files compile unchanged: the toolkit's own headers give the types (dim3, int4, __nv_bfloat16,
// __half, cudaError_t) and the host halves of the conversions; this header gives the built-in
// variables, barriers, shuffles and device math in terms of the emulator. The runtime's functions
// are declared by the toolkit's cuda_runtime_api.h and defined by cuda_runtime_stand_in.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <driver_types.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_emulator.h"

// Qualifiers. Static shared arrays become per-OS-thread statics: one block runs at a time.
#undef __shared__
#define __shared__ static thread_local
#undef __forceinline__
#define __forceinline__ inline
#undef __noinline__  // empty: a later `__attribute__((__noinline__))` in a standard header stays valid
#define __noinline__
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__

#define threadIdx (::cuda_emulator::thread_index())
#define blockIdx (::cuda_emulator::block_index())
#define blockDim (::cuda_emulator::block_dim())
#define gridDim (::cuda_emulator::grid_dim())

// The runtime's C++ overload for kernels (the C function takes const void*); the runtime itself
// is cuda_runtime_stand_in.cpp.
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

inline void __syncthreads() { ::cuda_emulator::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuda_emulator::sync_warp(mask); }

template <typename T>
T cuda_emulated_shuffle(unsigned mask, T value, int source) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::cuda_emulator::exchange(mask, bits, source);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
// As CUDA's, for width 32 (the only width kiln uses).
template <typename T>
T __shfl_sync(unsigned mask, T value, int source) {
  return cuda_emulated_shuffle(mask, value, source & 31);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return cuda_emulated_shuffle(mask, value, (::cuda_emulator::lane() ^ lane_mask) & 31);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  const int source = ::cuda_emulator::lane() + static_cast<int>(delta);
  const T other =
      cuda_emulated_shuffle(mask, value, source < 32 ? source : ::cuda_emulator::lane());
  return other;
}

// Atomics: a read-modify-write is atomic here, as threads switch only at barriers and shuffles.
inline int atomicMax(int* address, int value) {
  const int old = *address;
  if (value > old) *address = value;
  return old;
}
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}
inline int __float_as_int(float value) {
  int bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Device math with host equivalents.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
