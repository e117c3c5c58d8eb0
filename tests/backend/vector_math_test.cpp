// The CPU back-end's vector math (vector_math.h): the exponential its softmax and GELU loops take,
// against libm's, and the split of a loop among OpenMP threads.
#include "kiln/backend/cpu/vector_math.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kiln {
namespace {

// Relative distance to glibc's expf, in units of float's epsilon (2^-23).
double epsilons_apart(float value, float reference) {
  return std::fabs(static_cast<double>(value) - reference) / reference / std::numeric_limits<float>::epsilon();
}

TEST(ExpVectorizable, StaysWithinTwoUlpOfLibmOverItsDomain) {
  double worst = 0.0;
  float worst_at = 0.0f;
  for (float x = -87.3f; x <= 88.0f; x += 1.0e-4f * (1.0f + std::fabs(x))) {
    const double apart = epsilons_apart(exp_vectorizable(x), std::exp(x));
    if (apart > worst) worst = apart, worst_at = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_at;
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
}

TEST(ExpVectorizable, FlushesBelowTheSmallestNormalAndKeepsInfinitiesAndNaN) {
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_vectorizable(-87.4f), 0.0f);
  EXPECT_EQ(exp_vectorizable(-1000.0f), 0.0f);
  EXPECT_EQ(exp_vectorizable(-kInfinity), 0.0f);
  EXPECT_EQ(exp_vectorizable(88.5f), kInfinity);
  EXPECT_EQ(exp_vectorizable(kInfinity), kInfinity);
  EXPECT_TRUE(std::isnan(exp_vectorizable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GE(exp_vectorizable(-87.33f), std::numeric_limits<float>::min() * 0.99f);
}

// The cloned loop (the machine's best vector unit) over every tail length a 16-float vector can
// leave, against libm.
TEST(ExpShiftedInPlace, FollowsLibmForEveryTailLength) {
  for (int64_t count = 0; count <= 40; ++count) {
    std::vector<float> values(static_cast<size_t>(count) + 1, 123.0f);  // one past the end, untouched
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = -0.37f * static_cast<float>(i);
    exp_shifted_in_place(values.data(), count, 1.5f);
    for (int64_t i = 0; i < count; ++i)
      EXPECT_LE(epsilons_apart(values[static_cast<size_t>(i)], std::exp(-0.37f * static_cast<float>(i) - 1.5f)), 2.0)
          << "count " << count << ", element " << i;
    EXPECT_EQ(values.back(), 123.0f) << "count " << count << " wrote past its end";
  }
}

TEST(ForEachThreadRange, CoversTheRangeOnceInWholeVectorsInThreadOrder) {
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (int64_t count : {0, 1, 15, 16, 17, 100, 1000}) {
      std::vector<int> owner(static_cast<size_t>(count), -1), visits(static_cast<size_t>(count), 0);
      for_each_thread_range(count, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          owner[static_cast<size_t>(i)] = omp_get_thread_num();
          ++visits[static_cast<size_t>(i)];
        }
        if (end < count) {
          EXPECT_EQ((end - begin) % 16, 0) << "a piece that is not the last ends mid-vector";
        }
      });
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(visits[static_cast<size_t>(i)], 1)
            << "element " << i << " of " << count << ", " << threads << " threads";
        if (i > 0) {
          EXPECT_GE(owner[static_cast<size_t>(i)], owner[static_cast<size_t>(i - 1)]) << "not in thread order";
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

}  // namespace
}  // namespace kiln
