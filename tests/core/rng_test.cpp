#include "kiln/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {
namespace {

TEST(Rng, SameSeedSameStreamAndStateRestores) {
  Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  const auto saved = a.state();
  const float expected = a.normal(0.0f, 1.0f);
  Rng c(7);
  c.set_state(saved);
  EXPECT_EQ(c.normal(0.0f, 1.0f), expected);
}

TEST(Rng, NormalHasRightMoments) {
  Rng rng(1);
  double sum = 0, squares = 0;
  constexpr int kCount = 200000;
  for (int i = 0; i < kCount; ++i) {
    const double value = rng.normal(1.0f, 2.0f);
    sum += value;
    squares += value * value;
  }
  const double mean = sum / kCount;
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(squares / kCount - mean * mean), 2.0, 0.02);
}

TEST(Rng, BelowStaysInRange) {
  Rng rng(3);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(rng.below(7), 7u);
}

}  // namespace
}  // namespace kiln
