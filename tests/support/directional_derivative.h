// The whole-model gradient check: along a random direction d of the parameters, the central
// difference (L(p + h d) - L(p - h d)) / 2h must equal g . d. Central differences err by O(h^2);
// Richardson extrapolation of steps h and h/2 cancels that term, leaving fp32 rounding of the loss
// as the limit. For a model whose fp32 parameters are host memory (the CPU back-end).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/core/rng.h"

namespace kiln::testing {

struct DirectionalDerivative {
  double predicted = 0;  // g . d from the model's gradient
  double numeric = 0;    // the extrapolated central difference
};

// `params` and `grads`: `count` fp32 values each (the gradient of the loss at `params`);
// `loss()` evaluates the loss at the parameters as they are. The parameters are left as found.
// Parameters for which `held(index)` is true (a model's frozen ones, whose gradient is zero by
// contract) are not moved.
inline DirectionalDerivative directional_derivative(float* params, const float* grads, int64_t count,
                                                    const std::function<double()>& loss, uint64_t seed = 3,
                                                    double step = 8e-4,
                                                    const std::function<bool(int64_t)>& held = nullptr) {
  Rng rng(seed);
  std::vector<float> direction(static_cast<size_t>(count)), saved(params, params + count);
  DirectionalDerivative result;
  for (int64_t i = 0; i < count; ++i) {
    direction[static_cast<size_t>(i)] = rng.normal(0.0f, 1.0f);
    if (held && held(i)) direction[static_cast<size_t>(i)] = 0.0f;
    result.predicted += static_cast<double>(grads[i]) * direction[static_cast<size_t>(i)];
  }
  const auto loss_at = [&](double scale) {
    for (int64_t i = 0; i < count; ++i)
      params[i] = saved[static_cast<size_t>(i)] + static_cast<float>(scale * direction[static_cast<size_t>(i)]);
    return loss();
  };
  const auto central = [&](double h) { return (loss_at(h) - loss_at(-h)) / (2 * h); };
  result.numeric = (4 * central(step / 2) - central(step)) / 3;
  std::copy(saved.begin(), saved.end(), params);
  return result;
}

}  // namespace kiln::testing
