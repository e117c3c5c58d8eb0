#include "kiln/nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {

int32_t sample_token(std::span<const float> logits, float temperature, int64_t top_k, Rng& rng) {
  KILN_CHECK(!logits.empty(), "sample_token: no logits");
  KILN_CHECK(temperature >= 0.0f, "temperature must be >= 0, got {}", temperature);
  const auto argmax = [&] {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  if (temperature == 0.0f) return argmax();
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t keep = top_k > 0 ? std::min(logits.size(), static_cast<size_t>(top_k)) : logits.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const float max_logit = logits[order[0]];
  std::vector<double> weights(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    weights[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) / temperature);
    total += weights[i];
  }
  double draw = static_cast<double>(rng.uniform()) * total;
  for (size_t i = 0; i < keep; ++i) {
    draw -= weights[i];
    if (draw < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace kiln
