#include "kiln/optim/adamw.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

namespace {

// The segments' parts inside `shard`, with offsets relative to its start.
std::vector<AdamwSegment> segments_within(const std::vector<AdamwSegment>& segments, FlatRange shard) {
  std::vector<AdamwSegment> within;
  for (const AdamwSegment& segment : segments) {
    const int64_t begin = std::max(segment.offset, shard.begin);
    const int64_t end = std::min(segment.offset + segment.count, shard.end);
    if (begin < end) within.push_back({begin - shard.begin, end - begin, segment.weight_decay});
  }
  return within;
}

}  // namespace

AdamW::AdamW(Backend& backend, const ParameterLayout& layout, Tensor params, const AdamwConfig& config,
             FlatRange shard)
    : backend_(backend),
      config_(config),
      shard_(shard.count() > 0 ? shard : FlatRange{0, params.numel()}),
      segments_(segments_within(layout.adamw_segments(config.weight_decay), shard_)),
      master_(params.slice(shard_.begin, shard_.count())),
      params_(master_) {
  KILN_CHECK(config.beta1 >= 0 && config.beta1 < 1, "adam_beta1 must be in [0, 1), got {}", config.beta1);
  KILN_CHECK(config.beta2 >= 0 && config.beta2 < 1, "adam_beta2 must be in [0, 1), got {}", config.beta2);
  KILN_CHECK(config.eps > 0, "adam_eps must be positive, got {}", config.eps);
  KILN_CHECK(config.weight_decay >= 0, "weight_decay must be >= 0, got {}", config.weight_decay);
  const auto fp32_like_params = [&](std::unique_ptr<DeviceBuffer>& buffer) {
    Tensor tensor = params_;
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
  backend_.adamw_step({master_, params_, grads.slice(shard_.begin, shard_.count()), exp_avg_, exp_avg_sq_, segments_,
                       lr, config_.beta1, config_.beta2, config_.eps, grad_scale, steps_});
}

void AdamW::load_state(std::span<const float> master, std::span<const float> exp_avg,
                       std::span<const float> exp_avg_sq) {
  KILN_CHECK(master.size() == exp_avg.size() && master.size() == exp_avg_sq.size(),
             "optimizer state of {} master values, {} and {} moments", master.size(), exp_avg.size(),
             exp_avg_sq.size());
  // The values cover the parameters; the shard's elements past them are padding and stay zero.
  const int64_t present = std::clamp<int64_t>(static_cast<int64_t>(master.size()) - shard_.begin, 0, shard_.count());
  const auto load = [&](const Tensor& into, std::span<const float> values) {
    backend_.copy_to_device(into.data, values.data() + shard_.begin, static_cast<size_t>(present) * sizeof(float));
  };
  load(master_, master);
  load(exp_avg_, exp_avg);
  load(exp_avg_sq_, exp_avg_sq);
  if (master_buffer_) backend_.convert({params_, master_});
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace kiln
