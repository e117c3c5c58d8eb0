// The stream the CUDA back-end issues all its work on: every kernel (launch.cuh), every cuBLASLt
// product, the embedding gradient's sort and every copy of CudaBackend, in issue order. It is a
// stream of kiln's own, created non-blocking, rather than the legacy default stream, because the
// legacy stream cannot be captured into a CUDA graph (CudaBackend::capture) and would serialise
// against every other blocking stream in the process.
//
// One per process, as kiln drives one GPU per process: created on first use on the current device
// and never destroyed (work on it ends with the process). Whoever reads results on the host waits
// for it (cudaStreamSynchronize or an event on it); cudaMemcpy on the legacy stream does not.
#pragma once

#include <cuda_runtime_api.h>

namespace kiln::cuda {

cudaStream_t compute_stream();

// Whether the compute stream is being captured into a CUDA graph (CudaBackend::capture), where a
// wait or an event record outside the graph's own would invalidate the capture.
bool compute_stream_capturing();

}  // namespace kiln::cuda
