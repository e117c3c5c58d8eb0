// The emulator's streams and graphs (cuda_runtime_stand_in.cpp): work on a stream of its own runs
// when waited for, with the arguments it was issued with, and a kernel failing there is reported
// by the synchronisation; a captured stream records instead of running, an instantiated graph runs
// the records at every launch, and what CUDA forbids during a capture invalidates it.
#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <vector>

#include "cuda_emulator.h"

namespace {

__global__ void add_to_each(float* values, float amount) { values[threadIdx.x] += amount; }

// Thread 0 leaves before the barrier the others wait at: a failed launch.
__global__ void barrier_missed_by_thread_zero(float* values) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  values[threadIdx.x] = 1.0f;
}

struct Stream {
  Stream() { cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(stream); }
  cudaStream_t stream = nullptr;
};

TEST(CudaEmulatorStreams, WorkRunsWhenWaitedForWithTheArgumentsItWasIssuedWith) {
  Stream s;
  std::vector<float> values(4, 1.0f);
  float amount = 2.0f;
  cuda_emulator::launch_on(s.stream, add_to_each, dim3(1), dim3(4), 0, values.data(), amount);
  amount = 100.0f;
  EXPECT_EQ(values, std::vector<float>(4, 1.0f)) << "ran before anything waited for the stream";
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(values, std::vector<float>(4, 3.0f));

  cuda_emulator::launch_on(s.stream, barrier_missed_by_thread_zero, dim3(1), dim3(32), 0,
                           values.data());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "a valid configuration launches";
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

TEST(CudaEmulatorGraphs, CapturedWorkRunsOnlyWhenLaunchedAndAtEveryLaunch) {
  Stream s;
  std::vector<float> values(4, 0.0f);
  ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cuda_emulator::launch_on(s.stream, add_to_each, dim3(1), dim3(4), 0, values.data(), 1.0f);
  cuda_emulator::launch_on(s.stream, add_to_each, dim3(1), dim3(4), 0, values.data(), 10.0f);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(values, std::vector<float>(4, 0.0f)) << "recording ran the work";
  cudaGraphExec_t executable = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&executable, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  ASSERT_EQ(cudaGraphLaunch(executable, s.stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(executable, s.stream), cudaSuccess);
  EXPECT_EQ(values, std::vector<float>(4, 0.0f)) << "a launched graph runs when the stream does";
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(values, std::vector<float>(4, 22.0f));
  cudaGraphExecDestroy(executable);
}

TEST(CudaEmulatorGraphs, WhatCudaForbidsDuringACaptureInvalidatesIt) {
  Stream s;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeThreadLocal),
            cudaErrorStreamCaptureUnsupported)
      << "the legacy stream cannot be captured";
  std::vector<float> values(4, 0.0f);
  const auto refused = [&](auto forbidden) {
    EXPECT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda_emulator::launch_on(s.stream, add_to_each, dim3(1), dim3(4), 0, values.data(), 1.0f);
    EXPECT_NE(forbidden(), cudaSuccess);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
  };
  refused([&] { return cudaStreamSynchronize(s.stream); });
  refused([&] { return cudaDeviceSynchronize(); });
  refused([&] {
    void* memory = nullptr;
    return cudaMalloc(&memory, 64);
  });
  refused([&] {
    float host = 0.0f;
    return cudaMemcpy(&host, values.data(), sizeof(float), cudaMemcpyDeviceToHost);
  });
  refused([&] {
    const float pageable = 1.0f;
    return cudaMemcpyAsync(values.data(), &pageable, sizeof(float), cudaMemcpyHostToDevice,
                           s.stream);
  });
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(values, std::vector<float>(4, 0.0f)) << "nothing recorded by a failed capture ran";
}

}  // namespace
