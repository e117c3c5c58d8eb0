// A model's transformer blocks as one stack (GPT's and the encoder classifier's): their
// activations under a recompute policy (recompute.h, activations.h), the forward through all of
// them, and the backward through all of them from the last, which re-runs a recomputed chunk's
// forward (or a selectively recomputed GELU output) just before the backward that reads it.
//
// The activations' layout is BlockStackActivations (activations.h). Recomputation replays the very
// ops, dropout masks included (the pass names them), so gradients are those of the run that keeps
// everything.
#pragma once

#include <functional>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/nn/activations.h"
#include "kiln/nn/block.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/gpt_config.h"
#include "kiln/nn/parameters.h"
#include "kiln/nn/recompute.h"

namespace kiln {

// What a forward through the stack needs besides weights and activations.
struct BlockStackPass {
  const GptConfig& shape;                 // width, heads, LayerNorm epsilon (block.h)
  const std::vector<BlockWeights>& weights;
  const BlockStackActivations& acts;
  const Fp8Scaling* fp8 = nullptr;        // the blocks' fp8 products; null: none
  std::function<BlockPass(int64_t layer)> pass;  // each block's attention mask and dropout
};

// Runs every block from `input` (the embedding's output); returns the last block's output (`input`
// when there are no blocks). `training`: the backward will read this forward's activations, so
// the blocks that keep them write their fp8 codes too.
Tensor block_stack_forward(Backend& backend, const BlockStackPass& stack, const Tensor& input, bool training);

// The backward through every block, the last first: `d_residual` holds the gradient of the stack's
// output and is left holding its input's; parameter gradients go to `grads`, as `store` says.
// `input` is the stack's input (the forward's). With fp8, `d_residual`'s codes arrive in
// scratch.d_residual_fp8, cast by the LayerNorm backward that wrote it for the last block's MLP
// c_proj (input_gradient_reader()), unless that block's output gradient comes uncast (through the
// encoder's intermediate layers, BlockPass::output_gradient_cast) or is read dropped (hidden
// dropout, residual_gradient_codes). `gradients_final` is told as each block's parameter gradients
// become final (block_backward), the last block's first.
void block_stack_backward(Backend& backend, const BlockStackPass& stack, const std::vector<BlockWeights>& grads,
                          const Tensor& input, const BlockScratch& scratch, const Tensor& d_residual, GradStore store,
                          const GradientsFinalFrom& gradients_final);

// The most op scratch the blocks' fp8 products cast into (Backend::WorkspaceNeeds::fp8_cast_bytes)
// at M rows of width C: each product with its input's codes kept, the gradients' codes given as
// block.h says; `output_gradient_cast` false: a block's MLP casts its gradients itself (the last
// block's, BlockPass::output_gradient_cast false, or every block's under hidden dropout,
// residual_gradient_codes()).
size_t block_stack_fp8_cast_bytes(int64_t M, int64_t C, bool output_gradient_cast);

// The fp8 product that reads the gradient of block `layer`'s input next (the MLP c_proj of the
// block before it) and that product's bias gradient; none for layer 0, without fp8, or where that
// product reads the gradient dropped (residual_gradient_codes). `layer` may be the number of
// blocks: the reader of the stack output's gradient (ln_f's backward).
Fp8GradientReader input_gradient_reader(const BlockStackPass& stack, const std::vector<BlockWeights>& grads,
                                        int64_t layer);

}  // namespace kiln
