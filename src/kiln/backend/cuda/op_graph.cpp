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

}  // namespace

std::unique_ptr<OpGraph> CudaBackend::capture(const std::function<void()>& ops) {
  cudaStream_t stream = cuda::compute_stream();
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  // Ends the capture after a failed op, dropping what was recorded, so the stream works again.
  const auto abandon = [&] {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // the failure is the exception's to report
  };
  try {
    ops();
  } catch (const Error& error) {
    abandon();
    fail("CUDA graph capture failed: {} (ops being recorded may not copy, synchronise or allocate)",
         error.what());
  } catch (...) {
    abandon();
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  KILN_CHECK(ended == cudaSuccess && graph != nullptr,
             "CUDA graph capture failed ({}): an op copied, synchronised or allocated while being "
             "recorded",
             cudaGetErrorString(ended));
  cudaGraphExec_t executable = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&executable, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(instantiated, "cudaGraphInstantiate");
  ++graph_counts_->captures;
  return std::make_unique<CudaGraph>(executable, graph_counts_);
}

}  // namespace kiln
