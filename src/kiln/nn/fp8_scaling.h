// fp8 training of the transformer blocks' four products (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj; the tied classifier, attention, LayerNorm and the loss stay in the compute dtype), as
// NVIDIA Transformer Engine's DelayedScaling recipe does it: each product casts its input and
// weight to E4M3 and, in backward, its output gradient to E5M2 ("hybrid") or E4M3 ("e4m3"), each
// tensor with a scale of its own (ops.h, fp8 products). The scales come from the amax of earlier
// steps: after every optimizer step, update_scales() records each tensor's amax in its history and
// sets scale = fp8_max / max(history) / 2^margin ("max") or from the latest amax ("most_recent").
//
// Fp8Scaling owns one state row per tensor (layers x 4 products x 3 operands, the layout of
// Fp8UpdateScales) in the back-end's memory, starting at scale 1 with an empty history; a fresh
// run should calibrate (run one micro-batch and update) before its first step, so that the first
// step does not cast with scales of 1. The state is saved in checkpoints so a run resumes with its
// scales.
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
};

// The fp8 arguments of one block's four products.
struct BlockFp8 {
  Fp8Matmul qkv, attn_proj, fc, fc_proj;
};

class Fp8Scaling {
 public:
  Fp8Scaling(Backend& backend, int64_t layers, const Fp8Recipe& recipe);

  const BlockFp8& block(int64_t layer) const { return blocks_[static_cast<size_t>(layer)]; }
  // After optimizer step `step` (the calibration is step 0): the next scales (Fp8UpdateScales,
  // history slot step % amax_history).
  void update_scales(int64_t step);
  Tensor state() const { return state_; }  // [layers * 12, 4 + amax_history] fp32
  void load_state(std::span<const float> values);
  size_t bytes() const { return state_.bytes(); }
  // What the state of `layers` blocks with `amax_history` steps holds (kiln estimate's share).
  static size_t state_bytes(int64_t layers, int64_t amax_history);

 private:
  Backend& backend_;
  Fp8Recipe recipe_;
  std::unique_ptr<DeviceBuffer> buffer_;
  Tensor state_;
  std::vector<BlockFp8> blocks_;
};

}  // namespace kiln
