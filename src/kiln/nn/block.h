// One pre-LayerNorm GPT-2 transformer block with explicit forward and backward:
//   x1 = x + c_proj(attention(c_attn(ln_1(x))));   y = x1 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x1))))
//
// block_forward writes everything backward needs into `acts`; `projection` is [B,T,C] scratch
// for the c_proj outputs before their residual adds. block_backward reads `acts`, takes
// the gradient of the block output in `d_residual` and leaves the gradient of the block input
// there (the residual stream's gradient is updated in place, so no copy is needed between
// blocks); parameter gradients are added to `grads`. `scratch` supplies the backward temporaries.
// Recomputing a block means calling block_forward again on the saved input before its backward.
// With `fp8` (fp8_scaling.h) the four products cast their operands to fp8 (ops.h).
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

void block_forward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                   const Tensor& input, const BlockActivations& acts, const Tensor& projection,
                   const BlockFp8* fp8 = nullptr);

void block_backward(Backend& backend, const GptConfig& config, const BlockWeights& weights,
                    const BlockWeights& grads, const Tensor& input, const BlockActivations& acts,
                    const BlockScratch& scratch, const Tensor& d_residual, const BlockFp8* fp8 = nullptr);

}  // namespace kiln
