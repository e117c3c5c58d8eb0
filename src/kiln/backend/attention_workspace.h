// How much scratch the CUDA back-end's attention takes for one call, shared by the back-end (which
// reserves it) and `kiln estimate` (which predicts it). The fused kernels (bf16/fp16, head size up
// to 256: cuda/flash_attention.h on tensor cores, cuda/general_attention.h otherwise) keep the
// T x T scores on chip and need only D, one fp32 per (batch, head, query), in backward, and the
// tensor-core kernels when not deterministic (--no-deterministic-attention) fp32 sums of dQ, one
// per (batch, position, channel), after it; the materialised path (fp32, wider heads, or
// --no-fused-attention) forms the scores and their gradient, two batch x heads x T x T matrices in
// the compute dtype, each 256-byte aligned.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kiln/backend/fp8_workspace.h"
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

// The tiled kernels' head sizes (cuda/flash_attention.h; bf16/fp16 on sm_80 or newer).
inline bool tiled_attention_head(int64_t head_size) {
  return head_size > 0 && head_size <= 128 && head_size % 8 == 0;
}

// With fp8 the backward casts dqkv for c_attn's and takes its bias gradient (ops.h,
// AttentionBackward with fp8): dqkv's column sums in partial rows, one per 64-position tile of
// each sequence on the tiled path (cuda/flash_attention.h), one per kFp8CastTileRows rows where
// the gradient is cast after the attention (fp8_workspace.h; room for the more); there
// (`cast_after`) dqkv itself first, in the compute dtype. Both after the attention's own scratch.
constexpr int64_t kAttentionGradientTileRows = 64;
inline int64_t attention_gradient_partial_rows(int64_t batch, int64_t seq) {
  return batch * ((seq + kAttentionGradientTileRows - 1) / kAttentionGradientTileRows);
}

struct AttentionFp8Gradient {
  int64_t columns = 0;     // 3C with fp8, else 0 (no cast)
  bool cast_after = false;  // not the tiled path
};

// Where dQ's sums start in the fused scratch: after D, 256-byte aligned.
inline size_t attention_query_sums_offset(int64_t batch, int64_t heads, int64_t seq) {
  return (static_cast<size_t>(batch * heads * seq) * sizeof(float) + 255) / 256 * 256;
}

// The columns of dQ's fp32 sums a backward call needs: C (heads x head size) where the tensor-core
// kernels take it (`tiled`) and add dQ atomically (not `deterministic`), else 0.
inline int64_t attention_query_sum_columns(bool tiled, bool deterministic, int64_t C) {
  return tiled && !deterministic ? C : 0;
}

// query_sum_columns: attention_query_sum_columns'.
inline size_t attention_scratch_bytes(int64_t batch, int64_t heads, int64_t seq, DType dtype, bool fused,
                                      int64_t query_sum_columns = 0) {
  if (!fused) return 2 * attention_matrix_bytes(batch, heads, seq, dtype);
  if (query_sum_columns == 0) return static_cast<size_t>(batch * heads * seq) * sizeof(float);
  return attention_query_sums_offset(batch, heads, seq) +
         static_cast<size_t>(batch * seq * query_sum_columns) * sizeof(float);
}
inline size_t attention_staged_gradient_bytes(int64_t batch, int64_t seq, DType dtype, AttentionFp8Gradient fp8) {
  if (!fp8.cast_after) return 0;
  return (static_cast<size_t>(batch * seq * fp8.columns) * dtype_size(dtype) + 255) / 256 * 256;
}

// The attention's scratch, then with fp8 the staged dqkv (cast_after) and the partial sums.
inline size_t attention_workspace_bytes(int64_t batch, int64_t heads, int64_t seq, DType dtype, bool fused,
                                        AttentionFp8Gradient fp8 = {}, int64_t query_sum_columns = 0) {
  const size_t own = attention_scratch_bytes(batch, heads, seq, dtype, fused, query_sum_columns);
  if (fp8.columns == 0) return own;
  const size_t aligned = (own + 255) / 256 * 256;
  const int64_t partial_rows = std::max(attention_gradient_partial_rows(batch, seq), fp8_cast_tile_rows(batch * seq));
  return aligned + attention_staged_gradient_bytes(batch, seq, dtype, fp8) +
         static_cast<size_t>(partial_rows * fp8.columns) * sizeof(float);
}

}  // namespace kiln
