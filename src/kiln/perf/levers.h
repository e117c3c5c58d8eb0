// What each switch buys, before any run: the estimate (perf/estimator.h) of a configuration beside
// those that differ from it by one switch, so memory per GPU and the roofline of an iteration can
// be compared without trying each (`kiln estimate levers`). The switches: the recompute policy
// (none, selective, full uniform), the precision (bf16 against TF32), fp8 products (with bf16),
// with fp8 the classifier's products in fp8 or not, larger loss chunks (for a model whose loss
// runs over every position), half and twice the micro-batch at the same global batch, and with
// more than one GPU each ZeRO stage. A change that does not apply to the configuration (fp8 with
// dimensions that are not multiples of 16, a micro-batch that does not divide the global batch,
// ...) is listed with the estimator's reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/perf/estimator.h"

namespace kiln {

struct LeverEstimate {
  std::string change;  // "(as given)", or the flags that differ, e.g. "--fp8-format hybrid"
  std::optional<Estimate> estimate;  // nullopt where the change does not apply
  std::string not_applicable;        // why, then
};

// The configuration as given first (its estimate's errors propagate), then one row per switch.
std::vector<LeverEstimate> estimate_levers(const EstimateInput& in);

}  // namespace kiln
