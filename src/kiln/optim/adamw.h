// AdamW over the model's flat buffers (one fused pass per step, ARCHITECTURE.md decision 3).
//
// Owns the two Adam moments (fp32, zero-initialised) in the back-end's memory. Master weights are
// fp32: with fp32 model parameters the parameters are the master copy and are updated in place;
// with bf16/fp16 parameters (mixed precision) AdamW owns a separate fp32 master copy, made from
// the parameters at construction, and the same fused op writes the rounded parameters after each
// update (Micikevicius et al. 2018, "Mixed Precision Training"). Weight decay is decoupled and
// applies only to tensors the layout marks (2-D matrices), never to biases or LayerNorm parameters.
// The step counter counts applied (not skipped) steps, for bias correction.
//
// Sharded (ZeRO-1, the distributed optimizer): given a range of the flat buffer, AdamW keeps the
// master weights and moments of that range only and updates only its parameters; the caller
// reduces the gradients into the range first and gathers the parameters after (dist/).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/nn/parameters.h"

namespace kiln {

struct AdamwConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// Elements [begin, end) of the flat buffers.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t count() const { return end - begin; }
};

class AdamW {
 public:
  // `params`: the flat parameters (possibly followed by padding that belongs to no parameter);
  // `shard`: the part this optimizer owns, the whole of `params` when empty.
  AdamW(Backend& backend, const ParameterLayout& layout, Tensor params, const AdamwConfig& config,
        FlatRange shard = {});

  // One update of the shard with learning rate `lr`; grad_scale multiplies every gradient first
  // (loss-scale removal and clipping folded into one factor). `grads` is laid out as `params`.
  void step(Tensor grads, float lr, float grad_scale);

  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  FlatRange shard() const { return shard_; }
  // The shard's state (fp32, shard().count() elements).
  Tensor exp_avg() const { return exp_avg_; }
  Tensor exp_avg_sq() const { return exp_avg_sq_; }
  Tensor master() const { return master_; }  // the shard's parameters themselves when they are fp32
  // Replaces the shard's state from full flat values in layout order (the checkpoint's), rounding
  // the master weights into the shard's parameters.
  void load_state(std::span<const float> master, std::span<const float> exp_avg, std::span<const float> exp_avg_sq);
  size_t state_bytes() const { return 2 * exp_avg_.bytes(); }
  size_t master_bytes() const { return master_buffer_ ? master_.bytes() : 0; }  // 0: params are the master

 private:
  Backend& backend_;
  AdamwConfig config_;
  FlatRange shard_;
  std::vector<AdamwSegment> segments_;  // within the shard
  Tensor master_, params_;  // the shard's
  std::unique_ptr<DeviceBuffer> master_buffer_, exp_avg_buffer_, exp_avg_sq_buffer_;
  Tensor exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

// Clipping by global norm (Pascanu et al. 2013): the factor that brings `norm` to `max_norm`,
// or 1 when it is already within (or clipping is off, max_norm <= 0).
float clip_coefficient(double norm, float max_norm);

}  // namespace kiln
