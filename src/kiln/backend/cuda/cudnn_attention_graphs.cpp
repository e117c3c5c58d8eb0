// The attention core's cuDNN graphs (cudnn_attention_graphs.h).
#include "kiln/backend/cuda/cudnn_attention_graphs.h"

#include <fmt/format.h>

namespace kiln::cuda {

using cudnn::DataType;
using cudnn::OperationGraph;
using cudnn::PointwiseMode;
using cudnn::ReductionOperator;
using cudnn::TensorLayout;
using Id = OperationGraph::Id;

namespace {

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

std::string cudnn_attention_name(const CudnnAttentionShape& s, bool backward) {
  return fmt::format("cuDNN attention {} ({}x{}, {} heads of {}, {}{})", backward ? "backward" : "forward", s.B, s.T,
                     s.NH, s.HS, s.bf16 ? "bf16" : "fp16", s.causal ? ", causal" : "");
}

CudnnAttentionGraph cudnn_attention_forward_graph(const CudnnAttentionShape& shape) {
  const Layouts l = layouts_of(shape);
  CudnnAttentionGraph f(cudnn_attention_name(shape, false));
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
  return f;
}

CudnnAttentionGraph cudnn_attention_backward_graph(const CudnnAttentionShape& shape) {
  const Layouts l = layouts_of(shape);
  CudnnAttentionGraph b(cudnn_attention_name(shape, true));
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
  return b;
}

}  // namespace kiln::cuda
