// Kernel launch and dynamic shared memory, the two places where kiln's kernels need CUDA's own
// syntax (<<<...>>> and extern __shared__), behind launch() and KILN_DYNAMIC_SHARED_MEMORY, so
// that a host compiler can also build the kernel files for tests/cuda_emulator, which runs them on
// the CPU in CI. Under nvcc these are the plain CUDA forms; included by every .cu file that
// launches a kernel. While --profile-ops times launches (launch_timing.h), each is bracketed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/stream.h"

namespace kiln::cuda {

#if defined(__CUDACC__)

// kernel<<<grid, block, shared_bytes>>>(args...) on the compute stream (stream.h); the status is
// read with cudaGetLastError() as after any launch.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
  const TimedLaunch timed(reinterpret_cast<const void*>(kernel));
  kernel<<<grid, block, shared_bytes, compute_stream()>>>(args...);
}

// Declares `name`, the block's dynamic shared memory (the launch's shared_bytes) as unsigned char,
// 128-byte aligned. A declaration rather than a function returning a pointer: through the
// function, ptxas allocated registers differently (the flash forward kernel at head 128 spilled).
#define KILN_DYNAMIC_SHARED_MEMORY(name) extern __shared__ __align__(128) unsigned char name[]

#else  // a host compiler building the kernels against tests/cuda_emulator/include

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
  const TimedLaunch timed(reinterpret_cast<const void*>(kernel));
  ::cuda_emulator::launch_on(compute_stream(), kernel, grid, block, shared_bytes, args...);
}

#define KILN_DYNAMIC_SHARED_MEMORY(name) \
  unsigned char* const name = ::cuda_emulator::dynamic_shared_memory()

#endif

}  // namespace kiln::cuda
