// One pre-LayerNorm GPT-2 transformer block with explicit forward and backward:
//   x1 = x + c_proj(attention(c_attn(ln_1(x))));   y = x1 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x1))))
//
// block_forward writes everything backward needs into `acts`. Both projections add their residual
// themselves (MatmulForward::residual): the attention's c_proj writes x1 into acts.residual_mid
// and the MLP's c_proj writes y into acts.residual_out, so every LayerNorm is a plain one.
// block_backward reads `acts`, takes
// the gradient of the block output in `d_residual` and leaves the gradient of the block input
// there (the residual stream's gradient is updated in place, so no copy is needed between
// blocks); parameter gradients are added to `grads`, or written over them with `store` Write.
// `scratch` supplies the backward temporaries.
// Recomputing a block means calling block_forward again on the saved input before its backward
// (or on the previous recomputed block's output).
// With `fp8` (fp8_scaling.h) the four products cast their operands to fp8 (ops.h); ln_1 and ln_2
// cast their outputs for c_attn and c_fc themselves, writing only the codes, and so does c_fc its
// GELU output for the MLP's c_proj; the attention writes its output's codes for its c_proj besides
// the output (activations.h). In the backward the attention writes its gradient only as the codes
// c_attn's backward reads, in `scratch.d_qkv`'s memory, and each LayerNorm's backward also casts the
// residual stream's gradient for the projection that reads it next (the attention's c_proj after
// ln_2; after ln_1 the MLP c_proj of the block before, `input_gradient_reader`), into
// `scratch.d_residual_fp8`: so `d_residual` arrives with its codes there, written for this block's
// MLP c_proj by the caller's LayerNorm backward (ln_f's, or the next block's ln_1's). Where no
// LayerNorm wrote the output's gradient (the encoder's intermediate layers above its last block:
// BlockPass::output_gradient_cast false), the MLP's two products cast their output gradients
// themselves and take their own bias gradients; under hidden dropout both projections cast their
// dropped output gradients themselves (BranchDropout).
#pragma once

#include <functional>

#include "kiln/backend/backend.h"
#include "kiln/nn/activations.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/gpt_config.h"
#include "kiln/nn/parameters.h"

namespace kiln {

struct BlockScratch {
  Tensor d_hidden;    // [B,T,C]
  Tensor d_qkv;       // [B,T,3C]
  Tensor d_fc;        // [B,T,4C]
  // fp8 without hidden dropout: 2 x B*T*C bytes, codes of d_residual (GptActivations::d_residual_fp8)
  Tensor d_residual_fp8;
};

// Hidden dropout on the block's two residual branches (Megatron's hidden_dropout): each
// projection's output is dropped before the residual stream adds it, x1 = x + dropout(c_proj(..)),
// so the projection writes its output alone and the dropout adds the residual (ops.h, Dropout with
// a residual). The attention's draws Philox stream `attention_stream`, the MLP's `mlp_stream`,
// under `seed` (dropout_streams.h); the backward draws them again and drops the projections' output
// gradients with them, into scratch (d_hidden for the MLP's, d_qkv's memory for the attention's,
// each free then), so no mask is kept. probability 0: none, and the projections add the residual.
// With fp8 products the projections read the residual stream's gradient dropped, not as it is, so
// no LayerNorm backward casts it for them (residual_gradient_codes): each casts its dropped output
// gradient itself and takes its own bias gradient (ops.h, MatmulBackward).
struct BranchDropout {
  float probability = 0.0f;
  uint64_t seed = 0, attention_stream = 0, mlp_stream = 0;
  bool active() const { return probability > 0.0f; }
};

// What one forward of a block (and its backward) uses besides weights, input and activations: the
// attention's mask (GPT's causal one, or an encoder's key padding with the [B, T] int32 key_mask,
// ops.h), the dropout of its residual branches and the attention's dropout of its probabilities
// (ops.h, AttentionDropout: inside the attention op, whose backward draws the mask again).
struct BlockPass {
  AttentionMask mask = AttentionMask::Causal;
  Tensor key_mask = {};
  BranchDropout dropout = {};
  AttentionDropout attention_dropout = {};
  // fp8 backward only: whether the caller's LayerNorm backward casts the block output's gradient
  // (above), where residual_gradient_codes() allows it.
  bool output_gradient_cast = true;
};

// Whether a LayerNorm backward casts the residual stream's gradient for a projection of a block
// under `pass` (fp8 only): not under hidden dropout, whose projections read that gradient dropped
// (BranchDropout).
bool residual_gradient_codes(const BlockPass& pass);

// The same rule for a model's layout, from its configuration: whether an fp8 model with
// `hidden_dropout` lays out the residual stream's gradient codes (GptActivations::d_residual_fp8)
// and sizes its LayerNorms' casts for them. Never under hidden dropout, where no pass reads them.
inline bool lays_out_residual_gradient_codes(float hidden_dropout) { return hidden_dropout == 0.0f; }

// The fp8 product whose backward reads a LayerNorm backward's input gradient next, as its output
// gradient, and that product's bias gradient, which the LayerNorm then takes (ops.h,
// LayerNormBackward with fp8); no product: the LayerNorm casts nothing.
struct Fp8GradientReader {
  const Fp8Matmul* product = nullptr;
  Tensor dbias;
};

// `backward` with its input gradient also cast for `reader` into `codes` (BlockScratch::d_residual_fp8):
// rows then columns, in the reader's gradient format; unchanged without a reader.
LayerNormBackward layernorm_backward_feeding(LayerNormBackward backward, const Fp8GradientReader& reader,
                                             const Tensor& codes);
// `backward` (an fp8 product's) reading its output gradient as the codes another op wrote into
// `codes` for it, rows then columns (a LayerNorm backward, which took its bias gradient too, or the
// cross-entropy for the classifier, which has none; ops.h, MatmulBackward, dout cast already).
void read_gradient_codes(MatmulBackward& backward, const Tensor& codes);

// How much of the block block_forward runs: all of it, or what the block's own backward reads,
// which ends at the MLP's activation: the MLP's c_proj is skipped, whose output only feeds the
// next block (a recomputed chunk's last block, whose output is kept, activations.h). With fp8,
// c_fc then writes only the transposed codes of its GELU output, which that backward reads.
enum class BlockForwardExtent : uint8_t { Output, BackwardInputs };

// `acts` without the fp8 codes the products keep for the block's backward (the *_fp8_t), for a
// forward whose backward will not read them: one without gradients, or a recomputed block's first
// forward (its replay writes them again before the backward, activations.h).
BlockActivations without_backward_codes(BlockActivations acts);

void block_forward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                   const Tensor& input, const BlockActivations& acts, const BlockFp8* fp8 = nullptr,
                   BlockForwardExtent extent = BlockForwardExtent::Output, const BlockPass& pass = {});

// Told, as the block's backward issues its ops, each time the gradients from a tensor of `grads`
// on are final: after each product's weight gradient and each LayerNorm's (the parameters in the
// flat buffer's order, from the block's end down to its ln_1). Data parallelism starts gradient
// buckets from it (Model::set_gradients_final_listener).
using GradientsFinalFrom = std::function<void(const Tensor& first_final)>;

void block_backward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                    const BlockWeights& grads, const Tensor& input, const BlockActivations& acts,
                    const BlockScratch& scratch, const Tensor& d_residual, GradStore store,
                    const BlockFp8* fp8 = nullptr, const Fp8GradientReader& input_gradient_reader = {},
                    const BlockPass& pass = {}, const GradientsFinalFrom& gradients_final = {});

}  // namespace kiln
