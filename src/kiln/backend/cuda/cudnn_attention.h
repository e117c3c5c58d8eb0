// The attention core on cuDNN's fused flash-attention engines (`--cudnn-attention`), for the
// layouts of ops.h's AttentionForward and AttentionBackward: qkv [B, T, 3C] (q, k, v of each
// position side by side, heads HS apart), out and dout [B, T, C], lse [B, NH, T] (natural log, as
// the tiled kernels keep it: the backward of either reads the other's), dqkv [B, T, 3C].
//
// The graphs are cuDNN's documented fused-attention patterns (cudnn_attention_graphs.h). Each
// shape's plan is made at its first call and kept.
//
// Scope: bf16 or fp16, head size a multiple of 8 up to 128 (cudnn_attention_head), causal or no mask
// (key padding stays on kiln's kernels), 16-byte-aligned tensors; the back-end picks the calls
// (cuda_backend_shared.h, attention_path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kiln/backend/cuda/cudnn_api.h"
#include "kiln/backend/cuda/cudnn_attention_graphs.h"

namespace kiln::cuda {

// The head sizes kiln hands cuDNN: multiples of 8 up to 128, the sizes its tiled kernels take too.
bool cudnn_attention_head(int64_t head_size);

class CudnnAttention {
 public:
  struct Graph;  // a shape's operation graph and plan (cudnn_attention.cpp)

  // Loads cuDNN and makes a handle on the current device; a kiln::Error saying why if it cannot.
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  std::string version() const;  // "9.x.y (<library path>)"

  // The engine workspace a call needs (the plan is made here if it is new).
  size_t forward_workspace_bytes(const CudnnAttentionShape& shape);
  size_t backward_workspace_bytes(const CudnnAttentionShape& shape);

  // On the compute stream (stream.h). `scale` is the scores' factor (1 / sqrt(HS)); `workspace` has
  // the *_workspace_bytes above. The backward's `scratch` is attention_workspace.h's fused scratch
  // with C query-sum columns: D [B, NH, T] fp32, then, 256-byte aligned, dQ's fp32 sums
  // [B, NH, T, HS].
  void forward(const CudnnAttentionShape& shape, void* out, float* lse, const void* qkv, float scale,
               void* workspace);
  void backward(const CudnnAttentionShape& shape, void* dqkv, const void* dout, const void* qkv, const void* out,
                const float* lse, float scale, void* scratch, void* workspace);

 private:
  Graph& graph(const CudnnAttentionShape& shape, bool backward);

  cudnn::Handle handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>, std::unique_ptr<Graph>> graphs_;
};

}  // namespace kiln::cuda
