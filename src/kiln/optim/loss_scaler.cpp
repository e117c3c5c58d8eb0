#include "kiln/optim/loss_scaler.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

LossScaler::LossScaler() : LossScaler(fixed(1.0f)) {}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  KILN_CHECK(config.initial_scale > 0, "initial_loss_scale must be positive, got {}", config.initial_scale);
  KILN_CHECK(config.min_scale > 0, "min_loss_scale must be positive, got {}", config.min_scale);
  KILN_CHECK(config.growth_interval > 0, "loss_scale_window must be positive, got {}",
             config.growth_interval);
  KILN_CHECK(config.hysteresis > 0, "hysteresis must be positive, got {}", config.hysteresis);
  state_.scale = config.initial_scale;
  state_.hysteresis_tracker = config.hysteresis;
}

LossScaler LossScaler::fixed(float scale) {
  LossScalerConfig config;
  config.dynamic = false;
  config.initial_scale = scale;
  return LossScaler(config);
}

bool LossScaler::update(bool found_non_finite) {
  if (!config_.dynamic) return found_non_finite;
  if (found_non_finite) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0)
      state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    return true;
  }
  state_.growth_tracker += 1;
  if (state_.growth_tracker == config_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
    state_.scale *= config_.growth_factor;
  }
  return false;
}

}  // namespace kiln
