// Loss scaling for fp16 training, with Megatron-LM's semantics (DynamicGradScaler):
// after an iteration whose gradients hold inf/NaN, hysteresis is decremented and, once it
// reaches zero, the scale is multiplied by backoff_factor (0.5), never below min_scale; the
// iteration is skipped. After `growth_interval` consecutive clean iterations the scale is
// multiplied by growth_factor (2) and hysteresis is restored.
// A static scaler (--loss-scale S) never changes and still skips overflowing iterations.
// In fp32 and bf16 the scale is 1 and never changes.
#pragma once

#include <cstdint>

namespace kiln {

struct LossScalerConfig {
  bool dynamic = false;
  float initial_scale = 4294967296.0f;  // 2^32 (Megatron's --initial-loss-scale)
  float min_scale = 1.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 1000;        // --loss-scale-window
  int64_t hysteresis = 2;
};

struct LossScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class LossScaler {
 public:
  LossScaler();  // constant scale 1
  explicit LossScaler(const LossScalerConfig& config);
  static LossScaler fixed(float scale);

  float scale() const { return state_.scale; }
  // Records one iteration's outcome and adapts the scale. Returns true when the iteration must be
  // skipped (found_non_finite).
  bool update(bool found_non_finite);

  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace kiln
