#include "kiln/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "kiln/core/error.h"

namespace kiln {

LrDecayStyle parse_lr_decay_style(const std::string& name) {
  if (name == "constant") return LrDecayStyle::Constant;
  if (name == "linear") return LrDecayStyle::Linear;
  if (name == "cosine") return LrDecayStyle::Cosine;
  fail("lr_decay_style '{}' is not one of constant, linear, cosine", name);
}

const char* lr_decay_style_name(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::Constant: return "constant";
    case LrDecayStyle::Linear: return "linear";
    case LrDecayStyle::Cosine: return "cosine";
  }
  return "cosine";
}

float LrSchedule::at(int64_t iteration) const {
  if (warmup_iters > 0 && iteration <= warmup_iters)
    return max_lr * static_cast<float>(iteration) / static_cast<float>(warmup_iters);
  if (style == LrDecayStyle::Constant) return max_lr;
  if (iteration > decay_iters) return min_lr;
  const double span = static_cast<double>(decay_iters - warmup_iters);
  const double ratio = span > 0 ? static_cast<double>(iteration - warmup_iters) / span : 1.0;
  const double coeff =
      style == LrDecayStyle::Linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return static_cast<float>(min_lr + coeff * (max_lr - min_lr));
}

}  // namespace kiln
