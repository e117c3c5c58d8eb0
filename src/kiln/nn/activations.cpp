#include "kiln/nn/activations.h"

#include <algorithm>
#include <optional>

#include "kiln/core/error.h"
#include "kiln/nn/block.h"

namespace kiln {
namespace {

// Buffers that every block's views share instead of taking their own (none: each block takes its
// own; a measuring arena's views have no data, hence optional), and whether the blocks keep their
// products' fp8 input codes (activations.h).
struct SharedBlockBuffers {
  std::optional<Tensor> layernorm_out;  // ln1 and ln2 (with fp8: their E4M3 codes)
  std::optional<Tensor> gelu_out;       // fc_post_gelu (with fp8: its codes)
  bool fp8_codes = false;
};

Tensor own_or_shared(ActivationLayout& layout, const std::optional<Tensor>& shared, Shape shape) {
  return shared ? *shared : layout.take(shape);
}

// `mlp_codes`: with fp8, whether the block keeps the codes of its MLP c_proj's input; not where its
// GELU output is recomputed before its backward (selective).
BlockActivations take_block(ActivationLayout& layout, int64_t B, int64_t T, int64_t C, int64_t NH,
                            const SharedBlockBuffers& shared, bool mlp_codes) {
  BlockActivations block;
  block.ln1 = own_or_shared(layout, shared.layernorm_out, {B, T, C});
  block.ln1_mean = layout.stats({B * T});
  block.ln1_rstd = layout.stats({B * T});
  block.qkv = layout.take({B, T, 3 * C});
  block.attn_out = layout.take({B, T, C});
  block.attn_lse = layout.stats({B * NH * T});
  block.residual_mid = layout.take({B, T, C});
  block.ln2 = own_or_shared(layout, shared.layernorm_out, {B, T, C});
  block.ln2_mean = layout.stats({B * T});
  block.ln2_rstd = layout.stats({B * T});
  block.fc_pre_gelu = layout.take({B, T, 4 * C});
  block.fc_post_gelu = own_or_shared(layout, shared.gelu_out, {B, T, 4 * C});
  block.residual_out = layout.take({B, T, C});
  if (shared.fp8_codes) {
    block.attn_out_fp8 = own_or_shared(layout, shared.layernorm_out, {B * T, C});
    block.ln1_fp8_t = layout.codes({C, B * T});
    block.attn_out_fp8_t = layout.codes({C, B * T});
    block.ln2_fp8_t = layout.codes({C, B * T});
    if (mlp_codes) block.fc_post_gelu_fp8_t = layout.codes({4 * C, B * T});
  }
  return block;
}

}  // namespace

Tensor ActivationLayout::take_as(Shape shape, DType dtype) {
  Tensor tensor;
  tensor.shape = shape;
  tensor.dtype = dtype;
  tensor.device = device_;
  tensor.data = arena_.allocate(tensor.bytes());
  return tensor;
}

BlockStackActivations BlockStackActivations::lay_out(ActivationLayout& layout, int64_t layers, int64_t batch,
                                                     int64_t seq, int64_t hidden, int64_t heads,
                                                     const RecomputePolicy& policy, bool fp8) {
  const int64_t B = batch, T = seq, C = hidden, NH = heads;
  BlockStackActivations acts;
  acts.recompute = plan_recompute(policy, layers);
  const bool selective = std::any_of(acts.recompute.begin(), acts.recompute.end(),
                                     [](const LayerRecompute& plan) { return plan.gelu_recomputed; });
  SharedBlockBuffers shared;
  shared.fp8_codes = fp8;
  if (fp8) shared.layernorm_out = layout.codes({B * T, C});  // the LayerNorms write only codes (ops.h)
  if (fp8) shared.gelu_out = layout.codes({B * T, 4 * C});  // c_fc writes only the GELU output's codes
  else if (selective) shared.gelu_out = layout.take({B, T, 4 * C});
  // Selective with fp8: the codes its backward reads, recomputed (transposed) into the forward's
  // shared buffer of GELU codes, which no backward reads.
  if (fp8 && selective) acts.gelu_codes_recomputed = shared.gelu_out->reshaped({4 * C, B * T});
  std::vector<BlockActivations> slots;
  for (int64_t slot = 0; slot < recompute_scratch_slots(acts.recompute); ++slot)
    slots.push_back(take_block(layout, B, T, C, NH, shared, /*mlp_codes=*/true));
  for (int64_t layer = 0; layer < layers; ++layer) {
    const LayerRecompute& plan = acts.recompute[static_cast<size_t>(layer)];
    if (plan.recomputed) {
      BlockActivations block = slots[static_cast<size_t>(plan.scratch_slot)];
      if (layer == plan.chunk_last) block.residual_out = layout.take({B, T, C});  // the next chunk's input
      acts.blocks.push_back(block);
    } else {
      acts.blocks.push_back(take_block(layout, B, T, C, NH, shared, !plan.gelu_recomputed));
    }
  }
  return acts;
}

GptActivations GptActivations::lay_out(Arena& arena, const GptConfig& config, int64_t batch, int64_t seq,
                                       Device device, const RecomputePolicy& policy, DType dtype,
                                       int64_t logit_rows, bool fp8, bool fp8_classifier) {
  KILN_CHECK(logit_rows > 0, "logit rows per classifier chunk must be positive, got {}", logit_rows);
  const int64_t B = batch, T = seq, C = config.hidden_size, NH = config.num_heads;
  const int64_t Vp = config.padded_vocab_size();
  ActivationLayout layout(arena, device, dtype);
  GptActivations acts;
  acts.batch = batch;
  acts.seq = seq;
  acts.tokens = layout.ints({B, T});
  acts.targets = layout.ints({B, T});
  acts.embedded = layout.take({B, T, C});
  acts.stack = BlockStackActivations::lay_out(layout, config.num_layers, B, T, C, NH, policy, fp8);
  acts.lnf = layout.take({B, T, C});
  acts.lnf_mean = layout.stats({B * T});
  acts.lnf_rstd = layout.stats({B * T});
  acts.losses = layout.stats({B * T});
  acts.d_residual = layout.take({B, T, C});
  acts.d_hidden = layout.take({B, T, C});
  if (fp8 && lays_out_residual_gradient_codes(config.hidden_dropout)) acts.d_residual_fp8 = layout.codes({2, B * T, C});
  // One stretch for three buffers that are never in use at the same time (activations.h).
  ArenaOverlay overlay(arena);
  acts.logits = layout.take({std::min(logit_rows, B * T), Vp});
  if (fp8_classifier) {
    acts.logit_codes = layout.codes({2, std::min(logit_rows, B * T), Vp});
    acts.wte_fp8 = layout.codes({Vp, C});
    acts.wte_fp8_t = layout.codes({C, Vp});
  }
  overlay.next();
  acts.d_qkv = layout.take({B, T, 3 * C});
  overlay.next();
  acts.d_fc = layout.take({B, T, 4 * C});
  overlay.finish();
  return acts;
}

size_t GptActivations::bytes_needed(const GptConfig& config, int64_t batch, int64_t seq,
                                    const RecomputePolicy& policy, DType dtype, int64_t logit_rows, bool fp8,
                                    bool fp8_classifier) {
  Arena measure = Arena::measuring();
  lay_out(measure, config, batch, seq, Device::CPU, policy, dtype, logit_rows, fp8, fp8_classifier);
  return measure.used();
}

}  // namespace kiln
