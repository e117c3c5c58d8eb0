#include "kiln/backend/op_decorator.h"

namespace kiln {

void OpDecorator::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  around([&] { return OpWork{.op = "copy_to_device", .bytes = static_cast<double>(bytes), .host_copy = true}; },
         [&] { inner_->copy_to_device(device_dst, host_src, bytes); });
}
void OpDecorator::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  around([&] { return OpWork{.op = "copy_to_host", .bytes = static_cast<double>(bytes), .host_copy = true}; },
         [&] { inner_->copy_to_host(host_dst, device_src, bytes); });
}

// Every op: around() with its work and the inner back-end's call of the same name.
#define KILN_DECORATED_OP(op, Args)                                               \
  void OpDecorator::op(const Args& args) {                                        \
    around([&] { return work_of(args); }, [&] { inner_->op(args); });             \
  }
KILN_DECORATED_OP(embedding_forward, EmbeddingForward)
KILN_DECORATED_OP(embedding_backward, EmbeddingBackward)
KILN_DECORATED_OP(layernorm_forward, LayerNormForward)
KILN_DECORATED_OP(layernorm_backward, LayerNormBackward)
KILN_DECORATED_OP(matmul_forward, MatmulForward)
KILN_DECORATED_OP(matmul_backward, MatmulBackward)
KILN_DECORATED_OP(gelu_forward, GeluForward)
KILN_DECORATED_OP(gelu_backward, GeluBackward)
KILN_DECORATED_OP(tanh_forward, TanhForward)
KILN_DECORATED_OP(tanh_backward, TanhBackward)
KILN_DECORATED_OP(gather_rows, GatherRows)
KILN_DECORATED_OP(gather_rows_backward, GatherRowsBackward)
KILN_DECORATED_OP(mask_rows, MaskRows)
KILN_DECORATED_OP(attention_forward, AttentionForward)
KILN_DECORATED_OP(attention_backward, AttentionBackward)
KILN_DECORATED_OP(softmax_cross_entropy, SoftmaxCrossEntropy)
KILN_DECORATED_OP(adamw_step, AdamwStep)
KILN_DECORATED_OP(fp8_update_scales, Fp8UpdateScales)
KILN_DECORATED_OP(dropout, Dropout)
KILN_DECORATED_OP(fill, Fill)
KILN_DECORATED_OP(convert, Convert)
#undef KILN_DECORATED_OP

double OpDecorator::sum_of_squares(const SumOfSquares& args) {
  double result = 0.0;
  around([&] { return work_of(args); }, [&] { result = inner_->sum_of_squares(args); });
  return result;
}

}  // namespace kiln
