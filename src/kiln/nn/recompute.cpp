#include "kiln/nn/recompute.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

RecomputePolicy RecomputePolicy::parse(const std::string& granularity, const std::string& method,
                                       int64_t num_layers) {
  RecomputePolicy policy;
  if (granularity == "none" || granularity.empty()) {
    policy.granularity = RecomputeGranularity::None;
  } else if (granularity == "full") {
    policy.granularity = RecomputeGranularity::Full;
  } else if (granularity == "selective") {
    policy.granularity = RecomputeGranularity::Selective;
  } else {
    fail("config key 'recompute_granularity': '{}' is not one of none, full, selective", granularity);
  }
  if (method == "uniform" || method.empty()) {
    policy.method = RecomputeMethod::Uniform;
  } else if (method == "block") {
    policy.method = RecomputeMethod::Block;
  } else {
    fail("config key 'recompute_method': '{}' is not one of uniform, block", method);
  }
  KILN_CHECK(policy.granularity != RecomputeGranularity::Full || !method.empty(),
             "config key 'recompute_method': full recomputation needs a method, uniform or block");
  KILN_CHECK(num_layers > 0, "config key 'recompute_num_layers' must be positive, got {}", num_layers);
  policy.num_layers = num_layers;
  return policy;
}

std::string RecomputePolicy::describe() const {
  switch (granularity) {
    case RecomputeGranularity::None: return "none";
    case RecomputeGranularity::Selective: return "selective (GELU outputs; attention keeps no probabilities)";
    case RecomputeGranularity::Full:
      return fmt::format("full, {} {}", method == RecomputeMethod::Uniform ? "uniform chunks of" : "block, first",
                         num_layers);
  }
  return "none";
}

std::vector<LayerRecompute> plan_recompute(const RecomputePolicy& policy, int64_t layers) {
  std::vector<LayerRecompute> plan(static_cast<size_t>(layers));
  for (int64_t layer = 0; layer < layers; ++layer) {
    LayerRecompute& entry = plan[static_cast<size_t>(layer)];
    entry.chunk_first = entry.chunk_last = layer;
    entry.gelu_recomputed = policy.granularity == RecomputeGranularity::Selective;
  }
  if (policy.granularity != RecomputeGranularity::Full) return plan;
  KILN_CHECK(policy.method != RecomputeMethod::Block || policy.num_layers <= layers,
             "config key 'recompute_num_layers': {} exceeds the model's {} layers", policy.num_layers, layers);
  for (int64_t layer = 0; layer < layers; ++layer) {
    LayerRecompute& entry = plan[static_cast<size_t>(layer)];
    if (policy.method == RecomputeMethod::Uniform) {
      entry.recomputed = true;
      entry.chunk_first = layer / policy.num_layers * policy.num_layers;
      entry.chunk_last = std::min(layers - 1, entry.chunk_first + policy.num_layers - 1);
      entry.scratch_slot = layer - entry.chunk_first;
    } else if (layer < policy.num_layers) {
      entry.recomputed = true;  // a chunk of one layer; all share scratch slot 0
    }
  }
  return plan;
}

int64_t recompute_scratch_slots(const std::vector<LayerRecompute>& plan) {
  int64_t slots = 0;
  for (const LayerRecompute& entry : plan)
    if (entry.recomputed) slots = std::max(slots, entry.scratch_slot + 1);
  return slots;
}

}  // namespace kiln
