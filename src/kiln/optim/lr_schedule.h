// Learning-rate schedule with Megatron-LM's semantics (OptimizerParamScheduler.get_lr):
// linear warm-up from 0 to max_lr over warmup_iters, then constant, linear or cosine decay from
// max_lr to min_lr over the iterations up to decay_iters, then min_lr.
//   decay_ratio = (it - warmup) / (decay_iters - warmup)
//   linear: coeff = 1 - decay_ratio;  cosine: coeff = 0.5 (cos(pi decay_ratio) + 1)
//   lr = min_lr + coeff (max_lr - min_lr)
// `it` is the 1-based iteration being trained, so the first warm-up step already moves.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

enum class LrDecayStyle { Constant, Linear, Cosine };

LrDecayStyle parse_lr_decay_style(const std::string& name);  // throws naming the value
const char* lr_decay_style_name(LrDecayStyle style);

struct LrSchedule {
  float max_lr = 1e-4f;
  float min_lr = 0.0f;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 1;
  LrDecayStyle style = LrDecayStyle::Cosine;

  float at(int64_t iteration) const;
};

}  // namespace kiln
