// The CUDA back-end's host files turn a failed CUDA runtime call into a kiln::Error that names the
// call's purpose and CUDA's own description: "CUDA error in <what>: <cudaGetErrorString>".
#pragma once

namespace kiln::cuda {

// `status` is a cudaError_t (or a kernels.h launcher's status); 0 returns.
void check_cuda(int status, const char* what);

}  // namespace kiln::cuda
