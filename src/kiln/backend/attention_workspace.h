// How much scratch the CUDA back-end's attention takes for one call, shared by the back-end (which
// reserves it) and `kiln estimate` (which predicts it). The fused kernels (bf16/fp16, head size up
// to 256: cuda/flash_attention.h on tensor cores, cuda/general_attention.h otherwise) keep the
// T x T scores on chip and need only D, one fp32 per (batch, head, query), in backward; the
// materialised path (fp32, wider heads, or --no-fused-attention) forms the scores and their
// gradient, two batch x heads x T x T matrices in the compute dtype, each 256-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln {

constexpr int64_t kMaxFusedAttentionHeadSize = 256;

// Whether a call of this dtype and head size takes one of the fused paths (when they are on).
// fp32 stays on the materialised path: its products run on tensor cores (TF32) or at cuBLAS's
// fp32 speed, where fused CUDA-core kernels would be several times slower.
inline bool fused_attention_shape(DType dtype, int64_t head_size) {
  return (dtype == DType::BF16 || dtype == DType::F16) && head_size > 0 && head_size <= kMaxFusedAttentionHeadSize;
}

inline size_t attention_matrix_bytes(int64_t batch, int64_t heads, int64_t seq, DType dtype) {
  const auto bytes = static_cast<size_t>(batch * heads * seq * seq) * dtype_size(dtype);
  return (bytes + 255) / 256 * 256;
}

inline size_t attention_workspace_bytes(int64_t batch, int64_t heads, int64_t seq, DType dtype, bool fused) {
  return fused ? static_cast<size_t>(batch * heads * seq) * sizeof(float)
               : 2 * attention_matrix_bytes(batch, heads, seq, dtype);
}

}  // namespace kiln
