// AdamW over the model's flat buffers (one fused pass per step, ARCHITECTURE.md decision 3).
//
// Owns the two Adam moments (fp32, zero-initialised) in the back-end's memory. Master weights are
// fp32: with fp32 model parameters the parameters are the master copy and are updated in place;
// with bf16/fp16 parameters (mixed precision) AdamW owns a separate fp32 master copy, made from
// the parameters at construction, and the same fused op writes the rounded parameters after each
// update (Micikevicius et al. 2018, "Mixed Precision Training"). Weight decay is decoupled and
// applies only to tensors the layout marks (2-D matrices), never to biases or LayerNorm parameters.
// The step counter counts applied (not skipped) steps, for bias correction.
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

class AdamW {
 public:
  AdamW(Backend& backend, const ParameterLayout& layout, Tensor params, const AdamwConfig& config);

  // One update with learning rate `lr`; grad_scale multiplies every gradient first (loss-scale
  // removal and clipping folded into one factor).
  void step(Tensor grads, float lr, float grad_scale);

  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  Tensor exp_avg() const { return exp_avg_; }
  Tensor exp_avg_sq() const { return exp_avg_sq_; }
  Tensor master() const { return master_; }  // fp32; the parameters themselves when they are fp32
  // Replaces the master weights (fp32, layout order) and rounds them into the parameters.
  void load_master(std::span<const float> values);
  size_t state_bytes() const { return 2 * exp_avg_.bytes(); }
  size_t master_bytes() const { return master_buffer_ ? master_.bytes() : 0; }  // 0: params are the master

 private:
  Backend& backend_;
  AdamwConfig config_;
  std::vector<AdamwSegment> segments_;
  Tensor master_, params_;
  std::unique_ptr<DeviceBuffer> master_buffer_, exp_avg_buffer_, exp_avg_sq_buffer_;
  Tensor exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

// Clipping by global norm (Pascanu et al. 2013): the factor that brings `norm` to `max_norm`,
// or 1 when it is already within (or clipping is off, max_norm <= 0).
float clip_coefficient(double norm, float max_norm);

}  // namespace kiln
