// KILN_HOST_DEVICE marks a function that the host code, the CPU emulator of CUDA and the CUDA
// kernels all call: __host__ __device__ under nvcc, nothing for a host compiler.
#pragma once

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
