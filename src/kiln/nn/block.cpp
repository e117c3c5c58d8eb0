#include "kiln/nn/block.h"

#include "kiln/core/error.h"

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

// out = residual + dropout(projection), the projection's output written first into `out` (ops.h).
void dropped_residual_projection(Backend& backend, MatmulForward projection, const BranchDropout& dropout,
                                 uint64_t stream) {
  const Tensor residual = projection.residual;
  projection.residual = Tensor{};
  backend.matmul_forward(projection);
  backend.dropout({projection.out, projection.out, dropout.probability, dropout.seed, stream, residual});
}

// A residual branch's projection: with dropout, its output dropped before the residual adds it.
void project_onto_residual(Backend& backend, const MatmulForward& projection, const BranchDropout& dropout,
                           uint64_t stream) {
  if (dropout.active())
    dropped_residual_projection(backend, projection, dropout, stream);
  else
    backend.matmul_forward(projection);
}

// The gradient a residual branch's projection reads: the residual stream's, or with dropout that
// gradient dropped by the forward's mask, into `scratch` (as large as `d_residual` or larger).
Tensor branch_output_gradient(Backend& backend, const Tensor& d_residual, const Tensor& scratch,
                              const BranchDropout& dropout, uint64_t stream) {
  if (!dropout.active()) return d_residual;
  const Tensor dropped = scratch.slice(0, d_residual.numel()).reshaped(d_residual.shape);
  backend.dropout({dropped, d_residual, dropout.probability, dropout.seed, stream});
  return dropped;
}

// The attention core, which with fp8 also casts its output for c_proj (ops.h): the codes c_proj
// reads, and their transpose kept for its backward (where the block keeps them).
AttentionForward attention_feeding(const Fp8Matmul* projection, const BlockActivations& acts, int num_heads,
                                   const BlockPass& pass) {
  AttentionForward attention{acts.attn_out, acts.attn_lse, acts.qkv, pass.key_mask, num_heads, pass.mask};
  attention.dropout = pass.attention_dropout;
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

// The codes of an [M, N] gradient in `memory` of 2 M N bytes, by rows then by columns, in `format`.
struct GradientCodes {
  Tensor rows, columns;
};
GradientCodes gradient_codes(const Tensor& memory, int64_t M, int64_t N, DType format) {
  KILN_CHECK(static_cast<int64_t>(memory.bytes()) == 2 * M * N, "a gradient's codes take {} bytes, {} given",
             2 * M * N, memory.bytes());
  return {Tensor{memory.data, Shape{M, N}, format, memory.device},
          Tensor{static_cast<uint8_t*>(memory.data) + M * N, Shape{N, M}, format, memory.device}};
}

// With fp8 the attention only casts dqkv, for c_attn's backward, and takes its bias gradient
// (ops.h): the codes, [M, 3C] then their transpose [3C, M], take d_qkv's memory (2 x M x 3C bytes,
// its 16-bit size).
void cast_attention_gradient(AttentionBackward& attention, MatmulBackward& expansion, const BlockScratch& s,
                             GradStore store) {
  attention.dbias = expansion.dbias;
  read_gradient_codes(expansion, s.d_qkv);
  attention.dqkv = Tensor{};
  attention.fp8 = expansion.fp8;
  attention.dqkv_fp8 = expansion.dout;
  attention.dqkv_fp8_t = expansion.dout_fp8_t;
  attention.param_store = store;
}

// With fp8 the MLP's c_proj casts its input gradient (GELU's derivative applied) for c_fc's
// backward, and takes its bias gradient (ops.h, din_reader): the codes, [M, 4C] then their
// transpose [4C, M], take d_fc's memory (2 x M x 4C bytes, its 16-bit size).
void cast_mlp_gradient(MatmulBackward& contraction, MatmulBackward& expansion, const Tensor& d_fc) {
  contraction.reader_dbias = expansion.dbias;
  read_gradient_codes(expansion, d_fc);
  contraction.din = Tensor{};
  contraction.din_reader = expansion.fp8;
  contraction.din_fp8 = expansion.dout;
  contraction.din_fp8_t = expansion.dout_fp8_t;
}

}  // namespace

LayerNormBackward layernorm_backward_feeding(LayerNormBackward backward, const Fp8GradientReader& reader,
                                             const Tensor& codes) {
  if (!reader.product) return backward;
  const int64_t C = backward.weight.numel();
  const GradientCodes views = gradient_codes(codes, backward.din.numel() / C, C, reader.product->grad_dtype);
  backward.fp8 = reader.product;
  backward.din_fp8 = views.rows;
  backward.din_fp8_t = views.columns;
  backward.product_dbias = reader.dbias;
  return backward;
}

bool residual_gradient_codes(const BlockPass& pass) { return !pass.dropout.active(); }

void read_gradient_codes(MatmulBackward& backward, const Tensor& codes) {
  const int64_t N = backward.dout.shape[backward.dout.shape.rank - 1];
  const GradientCodes views = gradient_codes(codes, backward.dout.numel() / N, N, backward.fp8->grad_dtype);
  backward.dout = views.rows;
  backward.dout_fp8_t = views.columns;
  backward.dbias = Tensor{};
}

void block_forward(Backend& backend, const GptConfig& config, const BlockWeights& w,
                   const Tensor& input, const BlockActivations& acts, const BlockFp8* fp8,
                   BlockForwardExtent extent, const BlockPass& pass) {
  const BranchDropout& dropout = pass.dropout;
  const float eps = config.layernorm_eps;
  // With fp8 the LayerNorms cast their outputs for the products, which read the codes (ops.h).
  const Fp8Matmul* qkv = fp8_of(fp8, &BlockFp8::qkv);
  const Fp8Matmul* fc = fp8_of(fp8, &BlockFp8::fc);
  backend.layernorm_forward(layernorm_feeding(qkv, input, acts.ln1, acts.ln1_mean, acts.ln1_rstd, w.ln1_weight,
                                              w.ln1_bias, eps, acts.ln1_fp8_t));
  backend.matmul_forward({acts.qkv, acts.ln1, w.qkv_weight, w.qkv_bias, WeightLayout::InOut, Tensor{}, qkv});
  const Fp8Matmul* attn_proj = fp8_of(fp8, &BlockFp8::attn_proj);
  backend.attention_forward(attention_feeding(attn_proj, acts, static_cast<int>(config.num_heads), pass));
  project_onto_residual(backend,
                        residual_projection(acts.residual_mid, input, attn_proj ? acts.attn_out_fp8 : acts.attn_out,
                                            w.attn_proj_weight, w.attn_proj_bias, attn_proj),
                        dropout, dropout.attention_stream);
  backend.layernorm_forward(layernorm_feeding(fc, acts.residual_mid, acts.ln2, acts.ln2_mean, acts.ln2_rstd,
                                              w.ln2_weight, w.ln2_bias, eps, acts.ln2_fp8_t));
  const Fp8Matmul* fc_proj = fp8_of(fp8, &BlockFp8::fc_proj);
  backend.matmul_forward(mlp_expansion(acts.fc_pre_gelu, acts.ln2, w.fc_weight, w.fc_bias, fc, acts.fc_post_gelu,
                                       fc_proj, acts.fc_post_gelu_fp8_t, extent));
  if (extent == BlockForwardExtent::BackwardInputs) return;
  // With fp8 its input is c_fc's codes.
  project_onto_residual(backend,
                        residual_projection(acts.residual_out, acts.residual_mid, acts.fc_post_gelu,
                                            w.fc_proj_weight, w.fc_proj_bias, fc_proj),
                        dropout, dropout.mlp_stream);
}

BlockActivations without_backward_codes(BlockActivations acts) {
  acts.ln1_fp8_t = acts.attn_out_fp8_t = acts.ln2_fp8_t = acts.fc_post_gelu_fp8_t = Tensor{};
  return acts;
}

void block_backward(Backend& backend, const GptConfig& config, const BlockWeights& w,
                    const BlockWeights& g, const Tensor& input, const BlockActivations& acts,
                    const BlockScratch& s, const Tensor& d_residual, GradStore store, const BlockFp8* fp8,
                    const Fp8GradientReader& input_gradient_reader, const BlockPass& pass,
                    const GradientsFinalFrom& gradients_final) {
  const auto final_from = [&](const Tensor& first) {
    if (gradients_final) gradients_final(first);
  };
  const BranchDropout& dropout = pass.dropout;
  const bool residual_codes = fp8 && residual_gradient_codes(pass);
  KILN_CHECK(!residual_codes || !s.d_residual_fp8.empty(),
             "block_backward: fp8 products without the residual gradient's codes");
  // MLP branch: d_residual is d(y) = d(x1) through the skip connection (with fp8 and
  // pass.output_gradient_cast, also as the codes the caller's LayerNorm backward wrote: ln_f's or
  // the next block's ln_1's).
  // d_fc is the gradient of the pre-activation: GELU's derivative is applied inside.
  const Fp8Matmul* fc_proj = fp8_of(fp8, &BlockFp8::fc_proj);
  // With dropout the MLP's c_proj reads d_residual dropped, in d_hidden (free until c_fc's backward).
  MatmulBackward contraction{s.d_fc, g.fc_proj_weight, g.fc_proj_bias,
                             branch_output_gradient(backend, d_residual, s.d_hidden, dropout, dropout.mlp_stream),
                             product_input(acts.fc_post_gelu, acts.fc_post_gelu_fp8_t), w.fc_proj_weight,
                             WeightLayout::InOut, acts.fc_pre_gelu, fc_proj, acts.fc_post_gelu_fp8_t, store};
  const Fp8Matmul* fc = fp8_of(fp8, &BlockFp8::fc);
  MatmulBackward expansion_mlp{s.d_hidden, g.fc_weight, g.fc_bias, s.d_fc, product_input(acts.ln2, acts.ln2_fp8_t),
                               w.fc_weight, WeightLayout::InOut, Tensor{}, fc, acts.ln2_fp8_t, store};
  // Without the codes, c_proj casts d_residual (dropped) itself and writes its input gradient in the
  // compute dtype, which c_fc casts itself; each then takes its own bias gradient.
  const bool codes_given = residual_codes && pass.output_gradient_cast;
  if (codes_given) read_gradient_codes(contraction, s.d_residual_fp8);
  if (codes_given && fc) cast_mlp_gradient(contraction, expansion_mlp, s.d_fc);
  backend.matmul_backward(contraction);
  final_from(g.fc_proj_weight);  // its bias: here, or with the codes given by the LayerNorm backward that cast them
  backend.matmul_backward(expansion_mlp);
  final_from(g.fc_weight);
  const Fp8Matmul* attn_proj = fp8_of(fp8, &BlockFp8::attn_proj);
  backend.layernorm_backward(layernorm_backward_feeding({d_residual, g.ln2_weight, g.ln2_bias, s.d_hidden,
                                                         acts.residual_mid, w.ln2_weight, acts.ln2_mean, acts.ln2_rstd,
                                                         store},
                                                        residual_codes ? Fp8GradientReader{attn_proj, g.attn_proj_bias}
                                                                       : Fp8GradientReader{},
                                                        s.d_residual_fp8));
  final_from(g.ln2_weight);
  // Attention branch: d_residual is now d(x1) = d(x) through the skip connection. With dropout its
  // c_proj reads it dropped, in d_qkv's memory (free until the attention's backward writes it).
  MatmulBackward projection{s.d_hidden, g.attn_proj_weight, g.attn_proj_bias,
                            branch_output_gradient(backend, d_residual, s.d_qkv, dropout, dropout.attention_stream),
                            product_input(acts.attn_out, acts.attn_out_fp8_t), w.attn_proj_weight,
                            WeightLayout::InOut, Tensor{}, attn_proj, acts.attn_out_fp8_t, store};
  if (residual_codes) read_gradient_codes(projection, s.d_residual_fp8);
  backend.matmul_backward(projection);
  final_from(g.attn_proj_weight);
  const Fp8Matmul* qkv = fp8_of(fp8, &BlockFp8::qkv);
  AttentionBackward attention{s.d_qkv, s.d_hidden, acts.qkv, acts.attn_out, acts.attn_lse, pass.key_mask,
                              static_cast<int>(config.num_heads), pass.mask};
  attention.dropout = pass.attention_dropout;
  MatmulBackward expansion{s.d_hidden, g.qkv_weight, g.qkv_bias, s.d_qkv, product_input(acts.ln1, acts.ln1_fp8_t),
                           w.qkv_weight, WeightLayout::InOut, Tensor{}, qkv, acts.ln1_fp8_t, store};
  if (qkv) cast_attention_gradient(attention, expansion, s, store);
  backend.attention_backward(attention);
  backend.matmul_backward(expansion);
  final_from(g.qkv_weight);
  backend.layernorm_backward(layernorm_backward_feeding({d_residual, g.ln1_weight, g.ln1_bias, s.d_hidden, input,
                                                         w.ln1_weight, acts.ln1_mean, acts.ln1_rstd, store},
                                                        input_gradient_reader, s.d_residual_fp8));
  final_from(g.ln1_weight);
}

}  // namespace kiln
