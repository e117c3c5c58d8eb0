// The attention core on cuDNN (cudnn_attention.h).
#include "kiln/backend/cuda/cudnn_attention.h"

#include <fmt/format.h>

#include <limits>
#include <optional>
#include <vector>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/cudnn_graph.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/stream.h"

namespace kiln::cuda {

using Id = cudnn::OperationGraph::Id;

bool cudnn_attention_head(int64_t head_size) { return tiled_attention_head(head_size); }

// A shape's graph and the plan made for it.
struct CudnnAttention::Graph {
  CudnnAttentionGraph described;
  std::optional<cudnn::Plan> plan;
};

namespace {

constexpr size_t kFirstVersionZeroingQuerySums = 90600;  // before it, dQ's fp32 sums start as zeros by us

// `elements` bf16/fp16 elements further.
const void* at_elements(const void* base, int64_t elements) { return static_cast<const char*>(base) + 2 * elements; }
void* at_elements(void* base, int64_t elements) { return static_cast<char*>(base) + 2 * elements; }

}  // namespace

CudnnAttention::CudnnAttention() {
  const cudnn::Library& lib = cudnn::library();
  cudnn::check(lib.create(&handle_), "cudnnCreate (--cudnn-attention)");
}

CudnnAttention::~CudnnAttention() {
  graphs_.clear();
  if (handle_) cudnn::library().destroy(handle_);
}

std::string CudnnAttention::version() const {
  const cudnn::Library& lib = cudnn::library();
  return fmt::format("{} ({})", lib.version_text(), lib.path);
}

CudnnAttention::Graph& CudnnAttention::graph(const CudnnAttentionShape& shape, bool backward) {
  const auto [B, T, NH, HS, bf16, causal] = shape.key();
  auto& slot = graphs_[std::tuple(B, T, NH, HS, bf16, causal, backward)];
  if (!slot) {
    auto made = std::make_unique<Graph>(
        Graph{backward ? cudnn_attention_backward_graph(shape) : cudnn_attention_forward_graph(shape), std::nullopt});
    made->plan.emplace(made->described.graph.build(handle_));
    slot = std::move(made);
  }
  return *slot;
}

size_t CudnnAttention::forward_workspace_bytes(const CudnnAttentionShape& shape) {
  return static_cast<size_t>(graph(shape, false).plan->workspace_bytes());
}

size_t CudnnAttention::backward_workspace_bytes(const CudnnAttentionShape& shape) {
  return static_cast<size_t>(graph(shape, true).plan->workspace_bytes());
}

void CudnnAttention::forward(const CudnnAttentionShape& shape, void* out, float* lse, const void* qkv, float scale,
                             void* workspace) {
  const Graph& made = graph(shape, false);
  const CudnnAttentionGraph& f = made.described;
  const int64_t C = shape.NH * shape.HS;
  float lowest = std::numeric_limits<float>::lowest();
  cudnn::check(cudnn::library().set_stream(handle_, compute_stream()), "cudnnSetStream");
  std::vector<std::pair<Id, void*>> bindings{{f.q, const_cast<void*>(qkv)},
                                             {f.k, const_cast<void*>(at_elements(qkv, C))},
                                             {f.v, const_cast<void*>(at_elements(qkv, 2 * C))},
                                             {f.scale, &scale},
                                             {f.lse, lse},
                                             {f.out, out}};
  if (shape.causal) bindings.emplace_back(f.lowest, &lowest);
  const TimedLaunch timed("cuDNN attention forward");
  made.plan->run(handle_, bindings, workspace);
}

void CudnnAttention::backward(const CudnnAttentionShape& shape, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, float scale, void* scratch, void* workspace) {
  const Graph& made = graph(shape, true);
  const CudnnAttentionGraph& b = made.described;
  void* query_sums = static_cast<char*>(scratch) + attention_query_sums_offset(shape.B, shape.NH, shape.T);
  if (cudnn::library().version < kFirstVersionZeroingQuerySums)
    check_cuda(fill(query_sums, kFp32, 0.0f, shape.B * shape.T * shape.NH * shape.HS),
               "attention_backward (cuDNN: zeroing dQ's sums)");
  const int64_t C = shape.NH * shape.HS;
  float one = 1.0f, lowest = std::numeric_limits<float>::lowest();
  cudnn::check(cudnn::library().set_stream(handle_, compute_stream()), "cudnnSetStream");
  std::vector<std::pair<Id, void*>> bindings{{b.q, const_cast<void*>(qkv)},
                                             {b.k, const_cast<void*>(at_elements(qkv, C))},
                                             {b.v, const_cast<void*>(at_elements(qkv, 2 * C))},
                                             {b.out, const_cast<void*>(out)},
                                             {b.dout, const_cast<void*>(dout)},
                                             {b.lse, const_cast<float*>(lse)},
                                             {b.dq, dqkv},
                                             {b.dk, at_elements(dqkv, C)},
                                             {b.dv, at_elements(dqkv, 2 * C)},
                                             {b.row_dots, scratch},
                                             {b.query_sums, query_sums},
                                             {b.scale, &scale},
                                             {b.one, &one}};
  if (shape.causal) bindings.emplace_back(b.lowest, &lowest);
  const TimedLaunch timed("cuDNN attention backward");
  made.plan->run(handle_, bindings, workspace);
}

}  // namespace kiln::cuda
