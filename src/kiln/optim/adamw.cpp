#include "kiln/optim/adamw.h"

#include "kiln/core/error.h"

namespace kiln {

AdamW::AdamW(Backend& backend, const ParameterLayout& layout, Tensor params,
             const AdamwConfig& config)
    : backend_(backend),
      config_(config),
      segments_(layout.adamw_segments(config.weight_decay)),
      master_(params),
      params_(params) {
  KILN_CHECK(params.dtype == DType::F32,
             "AdamW: parameters in {} need a separate fp32 master copy, which the CPU back-end "
             "does not use; train with fp32 parameters",
             dtype_name(params.dtype));
  KILN_CHECK(config.beta1 >= 0 && config.beta1 < 1, "adam_beta1 must be in [0, 1), got {}", config.beta1);
  KILN_CHECK(config.beta2 >= 0 && config.beta2 < 1, "adam_beta2 must be in [0, 1), got {}", config.beta2);
  KILN_CHECK(config.eps > 0, "adam_eps must be positive, got {}", config.eps);
  KILN_CHECK(config.weight_decay >= 0, "weight_decay must be >= 0, got {}", config.weight_decay);
  exp_avg_buffer_ = backend_.allocate(params.bytes());
  exp_avg_sq_buffer_ = backend_.allocate(params.bytes());
  exp_avg_ = params;
  exp_avg_.data = exp_avg_buffer_->data();
  exp_avg_sq_ = params;
  exp_avg_sq_.data = exp_avg_sq_buffer_->data();
  backend_.fill({exp_avg_, 0.0f});
  backend_.fill({exp_avg_sq_, 0.0f});
}

void AdamW::step(Tensor grads, float lr, float grad_scale) {
  ++steps_;
  backend_.adamw_step({master_, params_, grads, exp_avg_, exp_avg_sq_, segments_, lr, config_.beta1,
                       config_.beta2, config_.eps, grad_scale, steps_});
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace kiln
