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
#include "kiln/backend/cuda/stream.h"

namespace kiln::cuda {

using cudnn::DataType;
using cudnn::OperationGraph;
using cudnn::PointwiseMode;
using cudnn::ReductionOperator;
using cudnn::TensorLayout;
using Id = OperationGraph::Id;

bool cudnn_attention_head(int64_t head_size) { return tiled_attention_head(head_size); }

namespace {

constexpr size_t kFirstVersionZeroingQuerySums = 90600;  // before it, dQ's fp32 sums start as zeros by us

// The layouts, as [batch, head, row, column] views of kiln's tensors.
struct Layouts {
  int64_t B, T, NH, HS, C;
  DataType io;

  // q, k or v of qkv [B, T, 3C] (each starts at its own base pointer)
  TensorLayout rows_of_qkv() const { return {{B, NH, T, HS}, {T * 3 * C, HS, 3 * C, 1}, io}; }
  // k or v of qkv transposed: [B, NH, HS, T]
  TensorLayout columns_of_qkv() const { return {{B, NH, HS, T}, {T * 3 * C, HS, 1, 3 * C}, io}; }
  TensorLayout rows_of_output() const { return {{B, NH, T, HS}, {T * C, HS, C, 1}, io}; }  // out, dout
  TensorLayout per_query() const { return {{B, NH, T, 1}, {NH * T, T, 1, 1}, DataType::Float}; }  // lse, D
  TensorLayout scores(DataType type) const { return {{B, NH, T, T}, {NH * T * T, T * T, T, 1}, type}; }
  TensorLayout scores_transposed(DataType type) const { return {{B, NH, T, T}, {NH * T * T, T * T, 1, T}, type}; }
  TensorLayout query_sums() const { return {{B, NH, T, HS}, {NH * T * HS, T * HS, HS, 1}, DataType::Float}; }
};

Layouts layouts_of(const CudnnAttentionShape& s) {
  return {s.B, s.T, s.NH, s.HS, s.NH * s.HS, s.bf16 ? DataType::BFloat16 : DataType::Half};
}

// The causal mask on scores `s`: positions whose key follows the query take the lowest float
// (`lowest`, a scalar); the others keep their score.
Id hide_later_keys(OperationGraph& g, const Layouts& l, Id s, Id lowest) {
  const Id row = g.virtual_tensor(l.scores(DataType::Int32)), column = g.virtual_tensor(l.scores(DataType::Int32));
  g.pointwise(PointwiseMode::GenerateIndex, {s}, row, DataType::Float, 2);
  g.pointwise(PointwiseMode::GenerateIndex, {s}, column, DataType::Float, 3);
  const Id visible = g.virtual_tensor(l.scores(DataType::Boolean));
  g.pointwise(PointwiseMode::CompareGreaterEqual, {row, column}, visible, DataType::Boolean);
  const Id masked = g.virtual_tensor(l.scores(DataType::Float));
  g.pointwise(PointwiseMode::BinarySelect, {s, lowest, visible}, masked);
  return masked;
}

Id binary(OperationGraph& g, PointwiseMode mode, Id a, Id b, const TensorLayout& out_layout) {
  const Id out = g.virtual_tensor(out_layout);
  g.pointwise(mode, {a, b}, out);
  return out;
}

}  // namespace

// A shape's graph and plan, and the ids run() binds.
struct CudnnAttention::Graph {
  OperationGraph graph;
  std::optional<cudnn::Plan> plan;
  Id q = 0, k = 0, v = 0, out = 0, dout = 0, lse = 0, dq = 0, dk = 0, dv = 0, row_dots = 0, query_sums = 0;
  Id scale = 0, one = 0, lowest = 0;
  explicit Graph(std::string what) : graph(std::move(what)) {}
};

namespace {

// S = scale Q K^T, masked; then softmax's statistics into lse and O = P V (cudnn_attention.h).
void build_forward(CudnnAttention::Graph& f, const CudnnAttentionShape& shape, const Layouts& l) {
  OperationGraph& g = f.graph;
  f.q = g.memory_tensor(l.rows_of_qkv());
  f.k = g.memory_tensor(l.columns_of_qkv());
  f.v = g.memory_tensor(l.rows_of_qkv());
  f.scale = g.scalar();
  const Id products = g.virtual_tensor(l.scores(DataType::Float));
  g.matmul(f.q, f.k, products);
  Id s = binary(g, PointwiseMode::Mul, products, f.scale, l.scores(DataType::Float));
  if (shape.causal) {
    f.lowest = g.scalar();
    s = hide_later_keys(g, l, s, f.lowest);
  }
  const Id max = g.virtual_tensor(l.per_query());
  g.reduction(ReductionOperator::Max, s, max);
  const Id shifted = binary(g, PointwiseMode::Sub, s, max, l.scores(DataType::Float));
  const Id exponentials = g.virtual_tensor(l.scores(DataType::Float));
  g.pointwise(PointwiseMode::Exp, {shifted}, exponentials);
  const Id sum = g.virtual_tensor(l.per_query());
  g.reduction(ReductionOperator::Add, exponentials, sum);
  const Id log_sum = g.virtual_tensor(l.per_query());
  g.pointwise(PointwiseMode::Log, {sum}, log_sum);
  f.lse = g.memory_tensor(l.per_query());
  g.pointwise(PointwiseMode::Add, {max, log_sum}, f.lse);
  const Id probabilities = binary(g, PointwiseMode::Div, exponentials, sum, l.scores(l.io));
  f.out = g.memory_tensor(l.rows_of_output());
  g.matmul(probabilities, f.v, f.out);
}

// P again from the statistics; dV = P^T dO; dS = P (dO V^T - D) scale; dK = dS^T Q; dQ = dS K,
// summed in fp32 then rounded (cudnn_attention.h).
void build_backward(CudnnAttention::Graph& b, const CudnnAttentionShape& shape, const Layouts& l) {
  OperationGraph& g = b.graph;
  b.q = g.memory_tensor(l.rows_of_qkv());
  b.k = g.memory_tensor(l.columns_of_qkv());
  b.v = g.memory_tensor(l.columns_of_qkv());
  b.out = g.memory_tensor(l.rows_of_output());
  b.dout = g.memory_tensor(l.rows_of_output());
  b.lse = g.memory_tensor(l.per_query());
  b.dq = g.memory_tensor(l.rows_of_qkv());
  b.dk = g.memory_tensor(l.rows_of_qkv());
  b.dv = g.memory_tensor(l.rows_of_qkv());
  b.scale = g.scalar();
  b.one = g.scalar();

  // D = rowsum(dO * O), into the caller's buffer
  const TensorLayout elementwise{{l.B, l.NH, l.T, l.HS}, {l.NH * l.T * l.HS, l.T * l.HS, l.HS, 1}, DataType::Float};
  const Id products = binary(g, PointwiseMode::Mul, b.dout, b.out, elementwise);
  const Id dots = g.virtual_tensor(l.per_query());
  g.reduction(ReductionOperator::Add, products, dots);
  b.row_dots = g.memory_tensor(l.per_query());
  g.pointwise(PointwiseMode::Mul, {dots, b.one}, b.row_dots);

  // P = exp(scale Q K^T - lse), masked
  const Id scores = g.virtual_tensor(l.scores(DataType::Float));
  g.matmul(b.q, b.k, scores);
  const Id scaled = binary(g, PointwiseMode::Mul, scores, b.scale, l.scores(DataType::Float));
  Id shifted = binary(g, PointwiseMode::Sub, scaled, b.lse, l.scores(DataType::Float));
  if (shape.causal) {
    b.lowest = g.scalar();
    shifted = hide_later_keys(g, l, shifted, b.lowest);
  }
  const Id probabilities = g.virtual_tensor(l.scores(DataType::Float));
  g.pointwise(PointwiseMode::Exp, {shifted}, probabilities);

  // dV = P^T dO
  const Id probabilities_t = g.virtual_tensor(l.scores_transposed(l.io));
  g.reshape(probabilities, probabilities_t);
  g.matmul(probabilities_t, b.dout, b.dv);

  // dS = P (dO V^T - D) scale
  const Id dp = g.virtual_tensor(l.scores(DataType::Float));
  g.matmul(b.dout, b.v, dp);
  const Id dp_kept = binary(g, PointwiseMode::Mul, dp, b.one, l.scores(DataType::Float));
  const Id centred = binary(g, PointwiseMode::Sub, dp_kept, b.row_dots, l.scores(DataType::Float));
  const Id ds_unscaled = binary(g, PointwiseMode::Mul, centred, probabilities, l.scores(DataType::Float));
  const Id ds = binary(g, PointwiseMode::Mul, ds_unscaled, b.scale, l.scores(DataType::Float));

  // dK = dS^T Q
  const Id ds_t = g.virtual_tensor(l.scores_transposed(l.io));
  g.reshape(ds, ds_t);
  g.matmul(ds_t, b.q, b.dk);

  // dQ = dS K, in fp32 sums, then rounded into dqkv
  const Id k_rows = g.virtual_tensor(l.rows_of_qkv());
  g.reshape(b.k, k_rows);
  b.query_sums = g.memory_tensor(l.query_sums());
  g.matmul(ds, k_rows, b.query_sums);
  g.pointwise(PointwiseMode::Identity, {b.query_sums}, b.dq);
}

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
  return fmt::format("{}.{}.{} ({})", lib.version / 10000, lib.version / 100 % 100, lib.version % 100, lib.path);
}

CudnnAttention::Graph& CudnnAttention::graph(const CudnnAttentionShape& shape, bool backward) {
  const auto [B, T, NH, HS, bf16, causal] = shape.key();
  auto& slot = graphs_[std::tuple(B, T, NH, HS, bf16, causal, backward)];
  if (!slot) {
    const Layouts l = layouts_of(shape);
    auto made = std::make_unique<Graph>(fmt::format("cuDNN attention {} ({}x{}, {} heads of {}, {}{})",
                                                    backward ? "backward" : "forward", B, T, NH, HS,
                                                    bf16 ? "bf16" : "fp16", causal ? ", causal" : ""));
    if (backward)
      build_backward(*made, shape, l);
    else
      build_forward(*made, shape, l);
    made->plan.emplace(made->graph.build(handle_));
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
  Graph& f = graph(shape, false);
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
  f.plan->run(handle_, bindings, workspace);
}

void CudnnAttention::backward(const CudnnAttentionShape& shape, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, float scale, void* scratch, void* workspace) {
  Graph& b = graph(shape, true);
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
  b.plan->run(handle_, bindings, workspace);
}

}  // namespace kiln::cuda
