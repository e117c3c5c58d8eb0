// The CPU emulator of CUDA itself (cuda_emulator.h): that it runs kernels as CUDA defines them
// (indices, barriers, shuffles), that it reports, as failed launches, the misuses the kernel tests
// rely on it to catch, and that its stand-ins for single instructions behave as the instruction
// does at the edges a kernel may rely on.
#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "kiln/backend/cuda/fast_exp2.cuh"

namespace {

// The status and failure of one launch, as a kernel launcher would see them.
struct Launched {
  int status;
  std::string failure;
};

template <typename... Params, typename... Args>
Launched launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                Args... args) {
  cuda_emulator::launch(kernel, grid, block, shared_bytes, args...);
  const int status = cuda_emulator::get_last_error();
  return {status, status ? cuda_emulator::failure() : ""};
}

__global__ void write_indices(int* out) {
  const unsigned thread = threadIdx.x + blockDim.x * threadIdx.y;
  const unsigned block = blockIdx.x + gridDim.x * blockIdx.y;
  out[block * blockDim.x * blockDim.y + thread] = static_cast<int>(block * 1000 + thread);
}

TEST(CudaEmulator, RunsEveryThreadOfEveryBlockWithItsIndices) {
  std::vector<int> out(2 * 3 * 32 * 2, -1);
  ASSERT_EQ(launch(write_indices, dim3(2, 3), dim3(32, 2), 0, out.data()).status, 0);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], static_cast<int>(i / 64 * 1000 + i % 64));
}

// Each thread writes its slot, waits, then reads its neighbour's: right only if the barrier holds
// every thread until all have written.
__global__ void rotate_through_shared(int* out) {
  __shared__ int slots[128];
  slots[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  __syncthreads();
  out[threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

__global__ void butterfly_sum(float* out) {
  float value = static_cast<float>(threadIdx.x);
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  out[threadIdx.x] = value + __shfl_sync(0xffffffffu, static_cast<float>(threadIdx.x), 5);
}

TEST(CudaEmulator, BarriersAndShufflesHaveCudaSemantics) {
  for (const auto schedule : {cuda_emulator::Schedule::Forward, cuda_emulator::Schedule::Reverse}) {
    cuda_emulator::set_schedule(schedule);
    std::vector<int> rotated(128);
    ASSERT_EQ(launch(rotate_through_shared, 1, 128, 0, rotated.data()).status, 0);
    for (int i = 0; i < 128; ++i) EXPECT_EQ(rotated[i], (i + 1) % 128 * 3);
    std::vector<float> sums(64);
    ASSERT_EQ(launch(butterfly_sum, 1, 64, 0, sums.data()).status, 0);
    for (int i = 0; i < 64; ++i)
      EXPECT_EQ(sums[i], (i < 32 ? 496.0f : 1520.0f) + (i < 32 ? 5.0f : 37.0f));
  }
  cuda_emulator::set_schedule(cuda_emulator::Schedule::Forward);
}

__global__ void barrier_in_one_branch() {
  if (threadIdx.x < 32) __syncthreads();
}

// Half a warp waits at __syncthreads for the other half, which waits in a shuffle for the first.
__global__ void barrier_or_shuffle() {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __shfl_sync(0xffffffffu, 1.0f, 0);
  }
}

__global__ void shuffle_with_an_exited_lane(float* out) {
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void write_past_dynamic_shared(int bytes) {
  unsigned char* shared = cuda_emulator::dynamic_shared_memory();
  if (threadIdx.x == 0) shared[bytes] = 1;
}

TEST(CudaEmulator, ReportsWhatAGpuWouldNotForgive) {
  Launched result = launch(barrier_in_one_branch, 1, 64, 0);
  EXPECT_EQ(result.status, 719);
  EXPECT_NE(result.failure.find("exited while other threads wait at __syncthreads"),
            std::string::npos)
      << result.failure;

  result = launch(barrier_or_shuffle, 1, 32, 0);
  EXPECT_EQ(result.status, 719);
  EXPECT_NE(result.failure.find("deadlock"), std::string::npos) << result.failure;

  std::vector<float> out(32);
  result = launch(shuffle_with_an_exited_lane, 1, 32, 0, out.data());
  EXPECT_EQ(result.status, 719);
  EXPECT_NE(result.failure.find("exited while its warp waits for it"), std::string::npos)
      << result.failure;

  result = launch(write_past_dynamic_shared, 1, 32, 1024, 1024);
  EXPECT_EQ(result.status, 719);
  EXPECT_NE(result.failure.find("past the 1024 bytes"), std::string::npos) << result.failure;

  result = launch(write_past_dynamic_shared, 1, 32, 64 * 1024, 0);
  EXPECT_EQ(result.status, 1) << "over 48 KiB of dynamic shared memory needs cudaFuncSetAttribute";
  ASSERT_EQ(cudaFuncSetAttribute(write_past_dynamic_shared,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  EXPECT_EQ(launch(write_past_dynamic_shared, 1, 32, 64 * 1024, 0).status, 0);

  std::vector<int> unused(1);
  EXPECT_EQ(launch(write_indices, 1, 2048, 0, unused.data()).status, 9)
      << "over 1024 threads in a block";
}

TEST(CudaEmulator, AWritePastACudaMallocAllocationAbortsWhenItIsFreed) {
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 40), cudaSuccess);
  static_cast<char*>(buffer)[39] = 1;  // the last byte is fine
  EXPECT_EQ(cudaFree(buffer), cudaSuccess);
  EXPECT_DEATH(
      {
        void* overrun = nullptr;
        cudaMalloc(&overrun, 40);
        static_cast<char*>(overrun)[40] = 1;
        cudaFree(overrun);
      },
      "wrote past the end of a 40-byte cudaMalloc allocation");
}

// ex2.approx.ftz.f32 (fast_exp2.cuh): subnormal results are written as 0 and subnormal inputs
// read as 0; normal results are 2^x.
TEST(CudaEmulator, Exp2FlushedFlushesSubnormalsAsTheFtzInstructionDoes) {
  using kiln::cuda::exp2_flushed;
  constexpr float kSmallestNormal = std::numeric_limits<float>::min();  // 2^-126
  EXPECT_EQ(exp2_flushed(-126.0f), kSmallestNormal);
  EXPECT_EQ(exp2_flushed(-126.5f), 0.0f) << "2^-126.5 is subnormal";
  EXPECT_EQ(exp2_flushed(-200.0f), 0.0f);
  EXPECT_EQ(exp2_flushed(-INFINITY), 0.0f);
  EXPECT_EQ(exp2_flushed(kSmallestNormal / 4), 1.0f) << "a subnormal input reads as 0";
  EXPECT_EQ(exp2_flushed(0.0f), 1.0f);
  EXPECT_FLOAT_EQ(exp2_flushed(-1.5f), std::exp2(-1.5f));
  EXPECT_FLOAT_EQ(exp2_flushed(10.25f), std::exp2(10.25f));
}

}  // namespace
