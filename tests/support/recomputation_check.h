// The check that every recomputation method gives the bits of the run that keeps everything: the
// loss and the gradients of `run(policy, loss)` under full (uniform 1 and 3, block 2) and selective
// recomputation equal the run without, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "kiln/nn/recompute.h"

namespace kiln::testing {

using RecomputedRun = std::function<std::vector<float>(const RecomputePolicy& policy, double& loss)>;

inline void expect_every_recomputation_bit_identical(const RecomputedRun& run) {
  double reference_loss = 0;
  const std::vector<float> reference = run(RecomputePolicy{}, reference_loss);
  for (const RecomputePolicy& recompute :
       {RecomputePolicy::parse("full", "uniform", 1), RecomputePolicy::parse("full", "uniform", 3),
        RecomputePolicy::parse("full", "block", 2), RecomputePolicy::parse("selective", "", 1)}) {
    double loss = 0;
    const std::vector<float> grads = run(recompute, loss);
    EXPECT_EQ(loss, reference_loss) << recompute.describe();
    ASSERT_EQ(grads.size(), reference.size()) << recompute.describe();
    EXPECT_EQ(std::memcmp(grads.data(), reference.data(), grads.size() * sizeof(float)), 0) << recompute.describe();
  }
}

}  // namespace kiln::testing
