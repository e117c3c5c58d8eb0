// The cuDNN operation graphs of the attention core (cudnn_attention.h), described apart from
// running them: host code only, so that the graphs can be built and handed to cuDNN's heuristics
// where no GPU is (cudnn_graph.h's DeviceProperties).
//
// The graphs are cuDNN's documented fused-attention patterns ("Fused Flash Attention fprop/bprop",
// cuDNN 9 developer guide), written op by op as NVIDIA's cudnn-frontend lowers its SDPA nodes:
// S = scale Q K^T, the causal mask as GEN_INDEX rows >= columns selecting S or the lowest float,
// softmax with its statistics (max + log sum), O = P V; the backward recomputes P from the
// statistics, takes D = rowsum(dO * O) into a caller buffer, and accumulates dQ in fp32 in another.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "kiln/backend/cuda/cudnn_graph.h"

namespace kiln::cuda {

struct CudnnAttentionShape {
  int64_t B, T, NH, HS;
  bool bf16;  // else fp16
  bool causal;
  auto key() const { return std::tuple(B, T, NH, HS, bf16, causal); }
};

// A shape's graph and the ids its run binds. Memory tensors, as [batch, head, row, column] views of
// kiln's layouts: q, k, v at their offsets in qkv [B, T, 3C] (k and v of the forward's products
// seen transposed); out, dout [B, T, C]; lse and row_dots [B, NH, T] fp32; dq, dk, dv at their
// offsets in dqkv; query_sums [B, NH, T, HS] fp32. By-value fp32 scalars: scale (1 / sqrt(HS)),
// one (1.0; the backward), lowest (the lowest float; causal graphs).
struct CudnnAttentionGraph {
  cudnn::OperationGraph graph;
  using Id = cudnn::OperationGraph::Id;
  Id q = 0, k = 0, v = 0, out = 0, dout = 0, lse = 0, dq = 0, dk = 0, dv = 0, row_dots = 0, query_sums = 0;
  Id scale = 0, one = 0, lowest = 0;
  explicit CudnnAttentionGraph(std::string what) : graph(std::move(what)) {}
};

// "cuDNN attention forward (4x1024, 12 heads of 64, bf16, causal)" and the like.
std::string cudnn_attention_name(const CudnnAttentionShape& shape, bool backward);

// S = scale Q K^T, masked; softmax's statistics into lse; out = P V.
CudnnAttentionGraph cudnn_attention_forward_graph(const CudnnAttentionShape& shape);

// P again from lse; dV = P^T dO; dS = P (dO V^T - D) scale; dK = dS^T Q; dQ = dS K, summed in fp32
// in query_sums, then rounded into dq.
CudnnAttentionGraph cudnn_attention_backward_graph(const CudnnAttentionShape& shape);

}  // namespace kiln::cuda
