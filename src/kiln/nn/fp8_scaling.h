// fp8 training of the transformer blocks' four products (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj) and, with Fp8Recipe::classifier, the tied classifier's (ln_f's output x wte^T;
// attention, LayerNorm and the loss stay in the compute dtype), as NVIDIA Transformer Engine's
// DelayedScaling recipe does it: each product casts its input and weight to E4M3 and, in backward,
// its output gradient to E5M2 ("hybrid") or E4M3 ("e4m3"), each tensor with a scale of its own
// (ops.h, fp8 products). The scales come from the amax of earlier steps: after every optimizer
// step, update_scales() records each tensor's amax in its history and sets
// scale = fp8_max / max(history) / 2^margin ("max") or from the latest amax ("most_recent").
//
// Fp8Scaling owns one state row per tensor (layers x 4 products x 3 operands, then the
// classifier's 3 operands where it is fp8; the layout of Fp8UpdateScales) in the back-end's memory,
// starting at scale 1 with an empty history; a fresh run should calibrate (run one micro-batch and
// update) before its first step, so that the first step does not cast with scales of 1. The state
// is saved in checkpoints so a run resumes with its scales.
//
// In memory a row holds more history slots than the recipe's amax_history when that makes the row a
// whole number of 16-byte units, and the rows start 3 floats into their allocation: so every row's
// scale_inv (column 1) is 16-byte aligned, as cuBLASLt reads an fp8 product's scale factors (an H100
// refused factors 4 bytes into 16: bench/NOTES.md, 2026-11-25). The extra slots are never written
// and stay 0, which changes no scale (amax values are >= 0; ops.h). Checkpoints hold the rows
// without them (saved_state, load_state), the layout of any amax_history.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln {

struct Fp8Recipe {
  DType grad_dtype = DType::F8E5M2;  // "hybrid"; DType::F8E4M3 for "e4m3"
  int margin = 0;                    // scales are divided by 2^margin
  int64_t amax_history = 1;          // steps of amax kept
  bool use_history_max = false;      // "max" over the history, else "most_recent"
  // The classifier's product in fp8 too. fp8 recipes commonly keep the output head in higher
  // precision (DeepSeek-V3, arXiv 2412.19437, section 3.3.1, does): here it is a switch, whose loss
  // curve bench/device-check.sh's loss stage measures against bf16's.
  bool classifier = false;
};

// The fp8 arguments of one block's four products.
struct BlockFp8 {
  Fp8Matmul qkv, attn_proj, fc, fc_proj;
};

class Fp8Scaling {
 public:
  Fp8Scaling(Backend& backend, int64_t layers, const Fp8Recipe& recipe);

  const BlockFp8& block(int64_t layer) const { return blocks_[static_cast<size_t>(layer)]; }
  // The classifier's fp8 arguments (in: ln_f's output, weight: wte, dout: the logits' gradient), or
  // null where the recipe keeps it in the compute dtype.
  const Fp8Matmul* classifier() const { return recipe_.classifier ? &classifier_ : nullptr; }
  const Fp8Recipe& recipe() const { return recipe_; }
  // After optimizer step `step` (the calibration is step 0): the next scales (Fp8UpdateScales,
  // history slot step % amax_history).
  void update_scales(int64_t step);
  // [layers * 12 (+ 3 with the classifier), 4 + slots] fp32 in the back-end's memory, slots >=
  // amax_history (above).
  Tensor state() const { return state_; }
  // The state as checkpoints hold it: [layers * 12, 4 + amax_history] (saved_shape), on the host.
  std::vector<float> saved_state() const;
  Shape saved_shape() const;
  // Values laid out as saved_state() gives them.
  void load_state(std::span<const float> values);
  size_t bytes() const { return buffer_bytes_; }  // the allocation
  // What the state of `layers` blocks under `recipe` takes (kiln estimate's share).
  static size_t state_bytes(int64_t layers, const Fp8Recipe& recipe);

 private:
  Backend& backend_;
  Fp8Recipe recipe_;
  std::unique_ptr<DeviceBuffer> buffer_;
  size_t buffer_bytes_ = 0;
  Tensor state_;
  std::vector<BlockFp8> blocks_;
  Fp8Matmul classifier_;  // with recipe_.classifier
};

}  // namespace kiln
