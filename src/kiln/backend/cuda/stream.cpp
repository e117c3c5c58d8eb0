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

}  // namespace kiln::cuda
