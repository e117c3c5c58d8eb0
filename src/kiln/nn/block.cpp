#include "kiln/nn/block.h"

namespace kiln {
namespace {

// One product's fp8 arguments, or null when the block computes in full precision.
const Fp8Matmul* fp8_of(const BlockFp8* fp8, Fp8Matmul BlockFp8::*product) {
  return fp8 ? &(fp8->*product) : nullptr;
}

// A LayerNorm of `in` feeding `product`: its output `out`, or with fp8 only the output's codes,
// `out` (the codes buffer, activations.h) and `codes_t` (kept for the product's backward), as ops.h
// casts them.
LayerNormForward layernorm_feeding(const Fp8Matmul* product, const Tensor& in, const Tensor& out, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight, const Tensor& bias, float eps,
                                   const Tensor& codes_t) {
  if (!product) return {out, mean, rstd, in, weight, bias, eps};
  return {Tensor{}, mean, rstd, in, weight, bias, eps, &product->in, out, codes_t};
}

// A product backward's input: none where the forward kept its fp8 codes (ops.h, in_fp8_t), whose
// 16-bit tensor may since have been overwritten (activations.h).
Tensor product_input(const Tensor& in, const Tensor& kept_codes) { return kept_codes.empty() ? in : Tensor{}; }

// A projection that adds the residual stream inside the product: out = residual + in W + bias
// (ops.h, MatmulForward::residual); with fp8 `in` is the codes its writer cast (and kept).
MatmulForward residual_projection(const Tensor& out, const Tensor& residual, const Tensor& in, const Tensor& weight,
                                  const Tensor& bias, const Fp8Matmul* fp8) {
  MatmulForward projection{out, in, weight, bias, WeightLayout::InOut, Tensor{}, fp8};
  projection.residual = residual;
  return projection;
}

// The attention core, which with fp8 also casts its output for c_proj (ops.h): the codes c_proj
// reads, and their transpose kept for its backward (where the block keeps them).
AttentionForward attention_feeding(const Fp8Matmul* projection, const BlockActivations& acts, int num_heads) {
  AttentionForward attention{acts.attn_out, acts.attn_lse, acts.qkv, Tensor{}, num_heads, AttentionMask::Causal};
  if (!projection) return attention;
  attention.fp8 = &projection->in;
  attention.out_fp8 = acts.attn_out_fp8;
  attention.out_fp8_t = acts.attn_out_fp8_t;
  return attention;
}

// The MLP's first product and its GELU: gelu_out = gelu(in W + b), the pre-activation kept in
// `pre_gelu`. Where the block keeps codes for the next product (`gelu_out` is E4M3 codes,
// activations.h) GELU's output is only cast for it (ops.h, gelu_fp8): into `gelu_out` unless
// `extent` stops before that product, and transposed into `codes_t` for its backward.
MatmulForward mlp_expansion(const Tensor& pre_gelu, const Tensor& in, const Tensor& weight, const Tensor& bias,
                            const Fp8Matmul* fp8, const Tensor& gelu_out, const Fp8Matmul* next,
                            const Tensor& codes_t, BlockForwardExtent extent) {
  MatmulForward expansion{pre_gelu, in, weight, bias, WeightLayout::InOut, gelu_out, fp8};
  if (gelu_out.dtype != DType::F8E4M3) return expansion;
  if (extent == BlockForwardExtent::BackwardInputs) expansion.gelu_out = Tensor{};
  expansion.gelu_fp8 = &next->in;
  expansion.gelu_out_t = codes_t;
  return expansion;
}

// With fp8 the attention only casts dqkv, for c_attn's backward, and takes its bias gradient
// (ops.h): the codes, [M, 3C] then their transpose [3C, M], take d_qkv's memory (2 x M x 3C bytes,
// its 16-bit size).
void cast_attention_gradient(AttentionBackward& attention, MatmulBackward& expansion, const BlockScratch& s,
                             const Fp8Matmul& qkv, GradStore store) {
  const int64_t M = s.d_qkv.shape[0] * s.d_qkv.shape[1], N = s.d_qkv.shape[2];
  const Tensor codes{s.d_qkv.data, Shape{M, N}, qkv.grad_dtype, s.d_qkv.device};
  const Tensor codes_t{static_cast<uint8_t*>(s.d_qkv.data) + M * N, Shape{N, M}, qkv.grad_dtype, s.d_qkv.device};
  attention.dqkv = Tensor{};
  attention.fp8 = &qkv;
  attention.dqkv_fp8 = codes;
  attention.dqkv_fp8_t = codes_t;
  attention.dbias = expansion.dbias;
  attention.param_store = store;
  expansion.dout = codes;
  expansion.dout_fp8_t = codes_t;
  expansion.dbias = Tensor{};
}

}  // namespace

void block_forward(Backend& backend, const GptConfig& config, const BlockWeights& w,
                   const Tensor& input, const BlockActivations& acts, const BlockFp8* fp8,
                   BlockForwardExtent extent) {
  const float eps = config.layernorm_eps;
  // With fp8 the LayerNorms cast their outputs for the products, which read the codes (ops.h).
  const Fp8Matmul* qkv = fp8_of(fp8, &BlockFp8::qkv);
  const Fp8Matmul* fc = fp8_of(fp8, &BlockFp8::fc);
  backend.layernorm_forward(layernorm_feeding(qkv, input, acts.ln1, acts.ln1_mean, acts.ln1_rstd, w.ln1_weight,
                                              w.ln1_bias, eps, acts.ln1_fp8_t));
  backend.matmul_forward({acts.qkv, acts.ln1, w.qkv_weight, w.qkv_bias, WeightLayout::InOut, Tensor{}, qkv});
  const Fp8Matmul* attn_proj = fp8_of(fp8, &BlockFp8::attn_proj);
  backend.attention_forward(attention_feeding(attn_proj, acts, static_cast<int>(config.num_heads)));
  backend.matmul_forward(residual_projection(acts.residual_mid, input, attn_proj ? acts.attn_out_fp8 : acts.attn_out,
                                             w.attn_proj_weight, w.attn_proj_bias, attn_proj));
  backend.layernorm_forward(layernorm_feeding(fc, acts.residual_mid, acts.ln2, acts.ln2_mean, acts.ln2_rstd,
                                              w.ln2_weight, w.ln2_bias, eps, acts.ln2_fp8_t));
  const Fp8Matmul* fc_proj = fp8_of(fp8, &BlockFp8::fc_proj);
  backend.matmul_forward(mlp_expansion(acts.fc_pre_gelu, acts.ln2, w.fc_weight, w.fc_bias, fc, acts.fc_post_gelu,
                                       fc_proj, acts.fc_post_gelu_fp8_t, extent));
  if (extent == BlockForwardExtent::BackwardInputs) return;
  // With fp8 its input is c_fc's codes.
  backend.matmul_forward(residual_projection(acts.residual_out, acts.residual_mid, acts.fc_post_gelu,
                                             w.fc_proj_weight, w.fc_proj_bias, fc_proj));
}

BlockActivations without_backward_codes(BlockActivations acts) {
  acts.ln1_fp8_t = acts.attn_out_fp8_t = acts.ln2_fp8_t = acts.fc_post_gelu_fp8_t = Tensor{};
  return acts;
}

void block_backward(Backend& backend, const GptConfig& config, const BlockWeights& w,
                    const BlockWeights& g, const Tensor& input, const BlockActivations& acts,
                    const BlockScratch& s, const Tensor& d_residual, GradStore store, const BlockFp8* fp8) {
  // MLP branch: d_residual is d(y) = d(x1) through the skip connection.
  // d_fc is the gradient of the pre-activation: GELU's derivative is applied inside.
  backend.matmul_backward({s.d_fc, g.fc_proj_weight, g.fc_proj_bias, d_residual,
                           product_input(acts.fc_post_gelu, acts.fc_post_gelu_fp8_t), w.fc_proj_weight,
                           WeightLayout::InOut, acts.fc_pre_gelu, fp8_of(fp8, &BlockFp8::fc_proj),
                           acts.fc_post_gelu_fp8_t, store});
  backend.matmul_backward({s.d_hidden, g.fc_weight, g.fc_bias, s.d_fc, product_input(acts.ln2, acts.ln2_fp8_t),
                           w.fc_weight, WeightLayout::InOut, Tensor{}, fp8_of(fp8, &BlockFp8::fc),
                           acts.ln2_fp8_t, store});
  backend.layernorm_backward({d_residual, g.ln2_weight, g.ln2_bias, s.d_hidden, acts.residual_mid,
                              w.ln2_weight, acts.ln2_mean, acts.ln2_rstd, store});
  // Attention branch: d_residual is now d(x1) = d(x) through the skip connection.
  backend.matmul_backward({s.d_hidden, g.attn_proj_weight, g.attn_proj_bias, d_residual,
                           product_input(acts.attn_out, acts.attn_out_fp8_t), w.attn_proj_weight,
                           WeightLayout::InOut, Tensor{}, fp8_of(fp8, &BlockFp8::attn_proj),
                           acts.attn_out_fp8_t, store});
  const Fp8Matmul* qkv = fp8_of(fp8, &BlockFp8::qkv);
  AttentionBackward attention{s.d_qkv, s.d_hidden, acts.qkv, acts.attn_out, acts.attn_lse, Tensor{},
                              static_cast<int>(config.num_heads), AttentionMask::Causal};
  MatmulBackward expansion{s.d_hidden, g.qkv_weight, g.qkv_bias, s.d_qkv, product_input(acts.ln1, acts.ln1_fp8_t),
                           w.qkv_weight, WeightLayout::InOut, Tensor{}, qkv, acts.ln1_fp8_t, store};
  if (qkv) cast_attention_gradient(attention, expansion, s, *qkv, store);
  backend.attention_backward(attention);
  backend.matmul_backward(expansion);
  backend.layernorm_backward({d_residual, g.ln1_weight, g.ln1_bias, s.d_hidden, input, w.ln1_weight,
                              acts.ln1_mean, acts.ln1_rstd, store});
}

}  // namespace kiln
