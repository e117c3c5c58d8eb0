#include "kiln/nn/block_stack.h"

#include <algorithm>

#include "kiln/backend/fp8_workspace.h"

namespace kiln {
namespace {

const BlockFp8* block_fp8(const BlockStackPass& stack, int64_t layer) {
  return stack.fp8 ? &stack.fp8->block(layer) : nullptr;
}

}  // namespace

Tensor block_stack_forward(Backend& backend, const BlockStackPass& stack, const Tensor& input, bool training) {
  Tensor x = input;
  for (size_t layer = 0; layer < stack.acts.blocks.size(); ++layer) {
    const BlockActivations& block = stack.acts.blocks[layer];
    // Codes for a backward only where this forward's results are the ones the backward reads.
    const bool backward_reads = training && !stack.acts.recompute[layer].recomputed;
    const auto l = static_cast<int64_t>(layer);
    block_forward(backend, stack.shape, stack.weights[layer], x, backward_reads ? block : without_backward_codes(block),
                  block_fp8(stack, l), BlockForwardExtent::Output, stack.pass(l));
    x = block.residual_out;
  }
  return x;
}

Fp8GradientReader input_gradient_reader(const BlockStackPass& stack, const std::vector<BlockWeights>& grads,
                                        int64_t layer) {
  if (!stack.fp8 || layer == 0 || !residual_gradient_codes(stack.pass(layer - 1))) return {};
  return Fp8GradientReader{&stack.fp8->block(layer - 1).fc_proj, grads[static_cast<size_t>(layer - 1)].fc_proj_bias};
}

size_t block_stack_fp8_cast_bytes(int64_t M, int64_t C, bool output_gradient_cast) {
  // c_attn C -> 3C, attn.c_proj C -> C, c_fc C -> 4C, mlp.c_proj 4C -> C, each with its input's
  // codes kept (mlp.c_proj's recomputed under selective recomputation, activations.h); mlp.c_proj
  // reading its output gradient as the codes a LayerNorm's backward cast and casting its 16-bit
  // input gradient from scratch for c_fc, which reads those codes (block.cpp).
  size_t bytes = std::max({fp8_cast_bytes(M, C, 3 * C, true), fp8_cast_bytes(M, C, C, true),
                           fp8_cast_bytes(M, C, 4 * C, true, /*dout_codes_given=*/true),
                           fp8_cast_bytes(M, 4 * C, C, true, /*dout_codes_given=*/true, false, /*din_cast=*/true)});
  // A block's MLP casting its output gradients itself: the same bytes as the din cast's today,
  // kept so that another region layout cannot leave it short.
  if (!output_gradient_cast)
    bytes = std::max({bytes, fp8_cast_bytes(M, C, 4 * C, true), fp8_cast_bytes(M, 4 * C, C, true)});
  return bytes;
}

void block_stack_backward(Backend& backend, const BlockStackPass& stack, const std::vector<BlockWeights>& grads,
                          const Tensor& input, const BlockScratch& scratch, const Tensor& d_residual, GradStore store,
                          const GradientsFinalFrom& gradients_final) {
  const std::vector<BlockActivations>& blocks = stack.acts.blocks;
  const auto input_of = [&](int64_t layer) { return layer ? blocks[static_cast<size_t>(layer - 1)].residual_out : input; };
  for (auto layer = static_cast<int64_t>(blocks.size()) - 1; layer >= 0; --layer) {
    const auto index = static_cast<size_t>(layer);
    const LayerRecompute& plan = stack.acts.recompute[index];
    if (plan.recomputed && layer == plan.chunk_last) {
      // Re-run the chunk's forward from its kept input. The chunk's last output is kept, so its
      // last block runs only as far as its backward reads.
      for (int64_t chunk_layer = plan.chunk_first; chunk_layer <= plan.chunk_last; ++chunk_layer)
        block_forward(backend, stack.shape, stack.weights[static_cast<size_t>(chunk_layer)], input_of(chunk_layer),
                      blocks[static_cast<size_t>(chunk_layer)], block_fp8(stack, chunk_layer),
                      chunk_layer == plan.chunk_last ? BlockForwardExtent::BackwardInputs : BlockForwardExtent::Output,
                      stack.pass(chunk_layer));
    }
    BlockActivations kept = blocks[index];
    if (plan.gelu_recomputed && stack.fp8) {  // selective: the codes of this layer's GELU output, transposed
      kept.fc_post_gelu_fp8_t = stack.acts.gelu_codes_recomputed;
      backend.gelu_forward({Tensor{}, kept.fc_pre_gelu, &block_fp8(stack, layer)->fc_proj.in, kept.fc_post_gelu_fp8_t});
    } else if (plan.gelu_recomputed) {  // selective: this layer's GELU output, into the buffer all layers share
      backend.gelu_forward({kept.fc_post_gelu, kept.fc_pre_gelu});
    }
    block_backward(backend, stack.shape, stack.weights[index], grads[index], input_of(layer), kept, scratch,
                   d_residual, store, block_fp8(stack, layer), input_gradient_reader(stack, grads, layer),
                   stack.pass(layer), gradients_final);
  }
}

}  // namespace kiln
