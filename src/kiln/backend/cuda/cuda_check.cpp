#include "kiln/backend/cuda/cuda_check.h"

#include <cuda_runtime_api.h>

#include "kiln/core/error.h"

namespace kiln::cuda {

void check_cuda(int status, const char* what) {
  KILN_CHECK(status == 0, "CUDA error in {}: {}", what,
             cudaGetErrorString(static_cast<cudaError_t>(status)));
}

}  // namespace kiln::cuda
