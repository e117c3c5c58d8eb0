#include "kiln/backend/op_checks.h"

namespace kiln::checks {

EmbeddingDims embedding_forward(const EmbeddingForward& a, Device device) {
  constexpr const char* op = "embedding_forward";
  require(a.out, DType::F32, device, op, "out");
  require(a.tokens, DType::I32, device, op, "tokens");
  require(a.wte, DType::F32, device, op, "wte");
  require(a.wpe, DType::F32, device, op, "wpe");
  const EmbeddingDims dims{a.tokens.shape[0], a.tokens.shape[1], a.wte.shape[1]};
  KILN_CHECK(dims.T <= a.wpe.shape[0], "{}: sequence {} exceeds {} positions", op, dims.T, a.wpe.shape[0]);
  require_numel(a.out, dims.B * dims.T * dims.C, op, "out");
  return dims;
}

EmbeddingDims embedding_backward(const EmbeddingBackward& a, Device device) {
  constexpr const char* op = "embedding_backward";
  require(a.dwte, DType::F32, device, op, "dwte");
  require(a.dwpe, DType::F32, device, op, "dwpe");
  require(a.dout, DType::F32, device, op, "dout");
  require(a.tokens, DType::I32, device, op, "tokens");
  const EmbeddingDims dims{a.tokens.shape[0], a.tokens.shape[1], a.dwte.shape[1]};
  require_numel(a.dout, dims.B * dims.T * dims.C, op, "dout");
  return dims;
}

RowsDims layernorm_forward(const LayerNormForward& a, Device device) {
  constexpr const char* op = "layernorm_forward";
  for (auto [tensor, name] : {std::pair{&a.out, "out"}, {&a.mean, "mean"}, {&a.rstd, "rstd"}, {&a.in, "in"},
                              {&a.weight, "weight"}, {&a.bias, "bias"}})
    require(*tensor, DType::F32, device, op, name);
  const int64_t C = a.weight.numel(), M = a.in.numel() / C;
  require_numel(a.in, M * C, op, "in");
  require_numel(a.out, M * C, op, "out");
  require_numel(a.mean, M, op, "mean");
  require_numel(a.rstd, M, op, "rstd");
  require_numel(a.bias, C, op, "bias");
  return {M, C};
}

RowsDims layernorm_backward(const LayerNormBackward& a, Device device) {
  constexpr const char* op = "layernorm_backward";
  for (auto [tensor, name] : {std::pair{&a.din, "din"}, {&a.dweight, "dweight"}, {&a.dbias, "dbias"},
                              {&a.dout, "dout"}, {&a.in, "in"}, {&a.weight, "weight"}, {&a.mean, "mean"},
                              {&a.rstd, "rstd"}})
    require(*tensor, DType::F32, device, op, name);
  const int64_t C = a.weight.numel(), M = a.in.numel() / C;
  require_numel(a.din, M * C, op, "din");
  require_numel(a.dout, M * C, op, "dout");
  require_numel(a.mean, M, op, "mean");
  require_numel(a.rstd, M, op, "rstd");
  return {M, C};
}

MatmulDims matmul_forward(const MatmulForward& a, Device device) {
  constexpr const char* op = "matmul_forward";
  require(a.out, DType::F32, device, op, "out");
  require(a.in, DType::F32, device, op, "in");
  require(a.weight, DType::F32, device, op, "weight");
  const MatmulDims dims = matmul_dims(a.in, a.weight, a.layout, op);
  require_numel(a.out, dims.M * dims.N, op, "out");
  if (!a.bias.empty()) {
    require(a.bias, DType::F32, device, op, "bias");
    require_numel(a.bias, dims.N, op, "bias");
  }
  return dims;
}

MatmulDims matmul_backward(const MatmulBackward& a, Device device) {
  constexpr const char* op = "matmul_backward";
  require(a.dout, DType::F32, device, op, "dout");
  require(a.in, DType::F32, device, op, "in");
  require(a.weight, DType::F32, device, op, "weight");
  require(a.dweight, DType::F32, device, op, "dweight");
  const MatmulDims dims = matmul_dims(a.in, a.weight, a.layout, op);
  require_numel(a.dout, dims.M * dims.N, op, "dout");
  KILN_CHECK(a.dweight.shape == a.weight.shape, "{}: dweight {} differs from weight {}", op,
             a.dweight.shape.to_string(), a.weight.shape.to_string());
  if (!a.din.empty()) {
    require(a.din, DType::F32, device, op, "din");
    require_numel(a.din, dims.M * dims.K, op, "din");
  }
  if (!a.dbias.empty()) {
    require(a.dbias, DType::F32, device, op, "dbias");
    require_numel(a.dbias, dims.N, op, "dbias");
  }
  return dims;
}

int64_t gelu_forward(const GeluForward& a, Device device) {
  require(a.out, DType::F32, device, "gelu_forward", "out");
  require(a.in, DType::F32, device, "gelu_forward", "in");
  require_numel(a.out, a.in.numel(), "gelu_forward", "out");
  return a.in.numel();
}

int64_t gelu_backward(const GeluBackward& a, Device device) {
  constexpr const char* op = "gelu_backward";
  require(a.din, DType::F32, device, op, "din");
  require(a.in, DType::F32, device, op, "in");
  require(a.dout, DType::F32, device, op, "dout");
  require_numel(a.din, a.in.numel(), op, "din");
  require_numel(a.dout, a.in.numel(), op, "dout");
  return a.in.numel();
}

AttentionShape attention_forward(const AttentionForward& a, Device device) {
  constexpr const char* op = "attention_forward";
  require(a.out, DType::F32, device, op, "out");
  require(a.probs, DType::F32, device, op, "probs");
  require(a.qkv, DType::F32, device, op, "qkv");
  const AttentionShape s = attention_shape(a.qkv, a.num_heads, op);
  require_numel(a.out, s.B * s.T * s.C, op, "out");
  require_numel(a.probs, s.B * s.NH * s.T * s.T, op, "probs");
  if (a.mask != AttentionMask::Causal) {
    require(a.key_mask, DType::I32, device, op, "key_mask");
    require_numel(a.key_mask, s.B * s.T, op, "key_mask");
  }
  return s;
}

AttentionShape attention_backward(const AttentionBackward& a, Device device) {
  constexpr const char* op = "attention_backward";
  require(a.dqkv, DType::F32, device, op, "dqkv");
  require(a.dprobs, DType::F32, device, op, "dprobs");
  require(a.dout, DType::F32, device, op, "dout");
  require(a.qkv, DType::F32, device, op, "qkv");
  require(a.probs, DType::F32, device, op, "probs");
  const AttentionShape s = attention_shape(a.qkv, a.num_heads, op);
  require_numel(a.dqkv, s.B * s.T * 3 * s.C, op, "dqkv");
  require_numel(a.dprobs, s.B * s.NH * s.T * s.T, op, "dprobs");
  require_numel(a.probs, s.B * s.NH * s.T * s.T, op, "probs");
  require_numel(a.dout, s.B * s.T * s.C, op, "dout");
  return s;
}

RowsDims softmax_cross_entropy(const SoftmaxCrossEntropy& a, Device device) {
  constexpr const char* op = "softmax_cross_entropy";
  require(a.logits, DType::F32, device, op, "logits");
  require(a.losses, DType::F32, device, op, "losses");
  require(a.targets, DType::I32, device, op, "targets");
  KILN_CHECK(a.logits.shape.rank == 2, "{}: logits must be [M, Vp], got {}", op, a.logits.shape.to_string());
  const RowsDims dims{a.logits.shape[0], a.logits.shape[1]};
  KILN_CHECK(a.vocab_size > 0 && a.vocab_size <= dims.C, "{}: vocab_size {} outside (0, {}]", op, a.vocab_size,
             dims.C);
  require_numel(a.losses, dims.M, op, "losses");
  require_numel(a.targets, dims.M, op, "targets");
  return dims;
}

int64_t residual_forward(const ResidualForward& a, Device device) {
  constexpr const char* op = "residual_forward";
  require(a.out, DType::F32, device, op, "out");
  require(a.a, DType::F32, device, op, "a");
  require(a.b, DType::F32, device, op, "b");
  require_numel(a.a, a.out.numel(), op, "a");
  require_numel(a.b, a.out.numel(), op, "b");
  return a.out.numel();
}

int64_t adamw_step(const AdamwStep& a, Device device) {
  constexpr const char* op = "adamw_step";
  require(a.master, DType::F32, device, op, "master");
  require(a.grad, DType::F32, device, op, "grad");
  require(a.exp_avg, DType::F32, device, op, "exp_avg");
  require(a.exp_avg_sq, DType::F32, device, op, "exp_avg_sq");
  KILN_CHECK(!a.param_out.empty(), "{}: argument 'param_out' is missing", op);
  const int64_t count = a.master.numel();
  for (auto [tensor, name] : {std::pair{&a.grad, "grad"}, {&a.exp_avg, "exp_avg"}, {&a.exp_avg_sq, "exp_avg_sq"},
                              {&a.param_out, "param_out"}})
    require_numel(*tensor, count, op, name);
  KILN_CHECK(a.step >= 1, "{}: step must be >= 1, got {}", op, a.step);
  const DType out = a.param_out.dtype;
  KILN_CHECK(out == DType::F32 || out == DType::BF16 || out == DType::F16,
             "{}: param_out dtype {} is not a floating type", op, dtype_name(out));
  for (const AdamwSegment& segment : a.segments)
    KILN_CHECK(segment.offset >= 0 && segment.count >= 0 && segment.offset + segment.count <= count,
               "{}: segment [{}, {}) outside {} parameters", op, segment.offset, segment.offset + segment.count, count);
  return count;
}

int64_t sum_of_squares(const SumOfSquares& a, Device device) {
  require(a.in, DType::F32, device, "sum_of_squares", "in");
  return a.in.numel();
}

int64_t fill(const Fill& a, Device device) {
  require(a.out, DType::F32, device, "fill", "out");
  return a.out.numel();
}

}  // namespace kiln::checks
