// One pre-LayerNorm GPT-2 transformer block with explicit forward and backward:
//   x1 = x + c_proj(attention(c_attn(ln_1(x))));   y = x1 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x1))))
//
// block_forward writes everything backward needs into `acts`. The attention's c_proj adds the
// residual itself, writing x1 into acts.residual_mid (MatmulForward::residual); `projection` is
// [B,T,C] scratch for the MLP's c_proj output before its residual add. The block's output y is left
// as its two addends, acts.residual_mid and that output in `projection` (output_of): the
// LayerNorm that reads y next, the next block's ln_1 or the final ln_f, adds them and writes y into
// acts.residual_out as it normalises it (normalize_input), so y is written once and not read back
// by a LayerNorm of its own. block_backward reads `acts`, takes
// the gradient of the block output in `d_residual` and leaves the gradient of the block input
// there (the residual stream's gradient is updated in place, so no copy is needed between
// blocks); parameter gradients are added to `grads`, or written over them with `store` Write.
// `scratch` supplies the backward temporaries.
// Recomputing a block means calling block_forward again on the saved input before its backward
// (or on the previous recomputed block's unsummed output).
// With `fp8` (fp8_scaling.h) the four products cast their operands to fp8 (ops.h); ln_1 and ln_2
// cast their outputs for c_attn and c_fc themselves, writing only the codes.
#pragma once

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
};

// A block's input x [B,T,C]: written already, or (unsummed) still the previous block's two
// addends, which normalize_input adds into `x` (the previous block's residual_out).
struct BlockInput {
  Tensor x;
  Tensor residual_mid, projection;  // both set when unsummed, else empty
  bool unsummed() const { return !residual_mid.empty(); }
};

// The output of the block whose activations are `acts`, as block_forward leaves it: unsummed.
BlockInput output_of(const BlockActivations& acts, const Tensor& projection);

// LayerNorm of `input` into norm's outputs (norm.in is ignored and set to input.x), adding the
// unsummed input into input.x first (residual_layernorm_forward). It reads input.projection, so
// nothing may overwrite that scratch between the previous block's forward and this call.
void normalize_input(Backend& backend, LayerNormForward norm, const BlockInput& input);

// How much of the block block_forward runs: all of it, or what the block's own backward reads,
// which ends at the MLP's activation: the MLP's c_proj is skipped, whose output only feeds the
// next block (a recomputed chunk's last block, whose output is kept, activations.h). With fp8 the
// skipped product's forward would also have kept its input's codes: the backward must then be
// given acts without fc_post_gelu_fp8_t (without_kept_mlp_codes) and casts that input itself,
// to the same codes.
enum class BlockForwardExtent : uint8_t { Output, BackwardInputs };

void block_forward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                   const BlockInput& input, const BlockActivations& acts, const Tensor& projection,
                   const BlockFp8* fp8 = nullptr, BlockForwardExtent extent = BlockForwardExtent::Output);

// `acts` with no kept codes for the MLP's c_proj, for the backward of a block run to
// BackwardInputs.
BlockActivations without_kept_mlp_codes(BlockActivations acts);

void block_backward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                    const BlockWeights& grads, const Tensor& input, const BlockActivations& acts,
                    const BlockScratch& scratch, const Tensor& d_residual, GradStore store,
                    const BlockFp8* fp8 = nullptr);

}  // namespace kiln
