// Validation of each op's arguments, written once for every back-end: dtypes, device, shapes and
// sizes, with errors naming the op and the argument. Each returns the sizes the op works on.
// Checks of values inside tensors (token ids, targets) need host access and stay with the CPU
// back-end and the callers (Gpt::forward).
#pragma once

#include "kiln/backend/checks.h"
#include "kiln/backend/ops.h"

namespace kiln::checks {

struct EmbeddingDims {  // also gather_rows': the sizes of its [B, T, C] input
  int64_t B, T, C;
};
struct RowsDims {
  int64_t M, C;  // rows and channels
};

EmbeddingDims embedding_forward(const EmbeddingForward& args, Device device);
EmbeddingDims embedding_backward(const EmbeddingBackward& args, Device device);
RowsDims layernorm_forward(const LayerNormForward& args, Device device);
RowsDims layernorm_backward(const LayerNormBackward& args, Device device);
MatmulDims matmul_forward(const MatmulForward& args, Device device);
MatmulDims matmul_backward(const MatmulBackward& args, Device device);
int64_t gelu_forward(const GeluForward& args, Device device);
int64_t gelu_backward(const GeluBackward& args, Device device);
int64_t tanh_forward(const TanhForward& args, Device device);
int64_t tanh_backward(const TanhBackward& args, Device device);
EmbeddingDims gather_rows(const GatherRows& args, Device device);
EmbeddingDims gather_rows_backward(const GatherRowsBackward& args, Device device);
RowsDims mask_rows(const MaskRows& args, Device device);
AttentionShape attention_forward(const AttentionForward& args, Device device);
AttentionShape attention_backward(const AttentionBackward& args, Device device);
RowsDims softmax_cross_entropy(const SoftmaxCrossEntropy& args, Device device);  // M rows, Vp columns
int64_t adamw_step(const AdamwStep& args, Device device);  // parameter count
int64_t sum_of_squares(const SumOfSquares& args, Device device);
int64_t fp8_update_scales(const Fp8UpdateScales& args, Device device);  // history length
int64_t dropout(const Dropout& args, Device device);
int64_t fill(const Fill& args, Device device);
int64_t convert(const Convert& args, Device device);

}  // namespace kiln::checks
