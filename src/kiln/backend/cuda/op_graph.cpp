// CudaBackend::capture (backend.h): the ops are recorded from the compute stream (stream.h) into a
// CUDA graph and instantiated; replay() launches it on the same stream. Capture runs in
// thread-local mode, so a call of this thread that CUDA forbids while recording (a synchronous
// copy, a synchronisation, cudaMalloc) invalidates the capture and is reported here, while other
// threads (the data loader's) are not restricted.
#include <cuda_runtime_api.h>

#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

using cuda::check_cuda;

class CudaGraph final : public OpGraph {
 public:
  CudaGraph(cudaGraphExec_t graph, std::shared_ptr<CudaBackend::GraphCounts> counts)
      : graph_(graph), counts_(std::move(counts)) {}
  ~CudaGraph() override { cudaGraphExecDestroy(graph_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void replay() override {
    check_cuda(cudaGraphLaunch(graph_, cuda::compute_stream()), "cudaGraphLaunch");
    ++counts_->replays;
  }

 private:
  cudaGraphExec_t graph_;
  std::shared_ptr<CudaBackend::GraphCounts> counts_;
};

// Ends the capture on `stream`, returning what was recorded (null if the capture was invalidated).
cudaGraph_t end_capture(cudaStream_t stream, cudaError_t& status) {
  cudaGraph_t graph = nullptr;
  status = cudaStreamEndCapture(stream, &graph);
  return graph;
}

}  // namespace

std::unique_ptr<OpGraph> CudaBackend::capture(const std::function<void()>& ops) {
  cudaStream_t stream = cuda::compute_stream();
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
  cudaError_t status = cudaSuccess;
  try {
    ops();
  } catch (const Error& error) {
    if (cudaGraph_t graph = end_capture(stream, status)) cudaGraphDestroy(graph);
    cudaGetLastError();  // the failed op's error is reported below
    fail("CUDA graph capture failed: {} (ops being recorded may not copy, synchronise or allocate)",
         error.what());
  } catch (...) {
    if (cudaGraph_t graph = end_capture(stream, status)) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = end_capture(stream, status);
  KILN_CHECK(status == cudaSuccess && graph != nullptr,
             "CUDA graph capture failed ({}): an op copied, synchronised or allocated while being "
             "recorded",
             cudaGetErrorString(status));
  cudaGraphExec_t executable = nullptr;
  status = cudaGraphInstantiate(&executable, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(status, "cudaGraphInstantiate");
  ++graph_counts_->captures;
  return std::make_unique<CudaGraph>(executable, graph_counts_);
}

}  // namespace kiln
