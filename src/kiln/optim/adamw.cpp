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
  KILN_CHECK(config.beta1 >= 0 && config.beta1 < 1, "adam_beta1 must be in [0, 1), got {}", config.beta1);
  KILN_CHECK(config.beta2 >= 0 && config.beta2 < 1, "adam_beta2 must be in [0, 1), got {}", config.beta2);
  KILN_CHECK(config.eps > 0, "adam_eps must be positive, got {}", config.eps);
  KILN_CHECK(config.weight_decay >= 0, "weight_decay must be >= 0, got {}", config.weight_decay);
  const auto fp32_like_params = [&](std::unique_ptr<DeviceBuffer>& buffer) {
    Tensor tensor = params;
    tensor.dtype = DType::F32;
    buffer = backend_.allocate(tensor.bytes());
    tensor.data = buffer->data();
    return tensor;
  };
  if (params.dtype != DType::F32) {
    master_ = fp32_like_params(master_buffer_);
    backend_.convert({master_, params_});
  }
  exp_avg_ = fp32_like_params(exp_avg_buffer_);
  exp_avg_sq_ = fp32_like_params(exp_avg_sq_buffer_);
  backend_.fill({exp_avg_, 0.0f});
  backend_.fill({exp_avg_sq_, 0.0f});
}

void AdamW::step(Tensor grads, float lr, float grad_scale) {
  ++steps_;
  backend_.adamw_step({master_, params_, grads, exp_avg_, exp_avg_sq_, segments_, lr, config_.beta1,
                       config_.beta2, config_.eps, grad_scale, steps_});
}

void AdamW::load_master(std::span<const float> values) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == master_.numel(), "{} master values given, the model has {}",
             values.size(), master_.numel());
  backend_.copy_to_device(master_.data, values.data(), values.size() * sizeof(float));
  if (master_buffer_) backend_.convert({params_, master_});
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace kiln
