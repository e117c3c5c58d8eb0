#include "kiln/backend/cuda/stream.h"

#include "kiln/core/error.h"

namespace kiln::cuda {

cudaStream_t compute_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t created = nullptr;
    const cudaError_t status = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
    KILN_CHECK(status == cudaSuccess, "CUDA error creating the compute stream: {}",
               cudaGetErrorString(status));
    return created;
  }();
  return stream;
}

bool compute_stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(compute_stream(), &status);
  KILN_CHECK(error == cudaSuccess, "CUDA error in cudaStreamIsCapturing: {}", cudaGetErrorString(error));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace kiln::cuda
