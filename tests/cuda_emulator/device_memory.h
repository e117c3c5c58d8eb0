// Device memory for the emulator tests that drive the CUDA back-end's pieces directly (cuda::LtMatmul):
// cudaMalloc'd for the object's life, the allocation checked.
#pragma once

#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cstddef>

namespace kiln::testing {

struct DeviceMemory {
  explicit DeviceMemory(size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceMemory() { cudaFree(data); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* data = nullptr;
};

}  // namespace kiln::testing
