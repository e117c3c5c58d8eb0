// The CPU back-end's vector math (vector_math.h): the exponential its softmax and GELU loops take,
// against libm's, and the split of a loop among OpenMP threads.
#include "kiln/backend/cpu/vector_math.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace kiln {
namespace {

// Units in the last place between two positive normal floats: how many floats lie between them.
int64_t ulps_apart(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) - static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

// e^x for each x, through the cloned loop: the machine's widest vector unit, as the back-end runs it.
std::vector<float> exp_in_the_vector_unit(std::vector<float> values) {
  exp_shifted_in_place(values.data(), static_cast<int64_t>(values.size()), 0.0f);
  return values;
}

TEST(ExpVectorizable, StaysWithinTwoUlpOfLibmOverItsDomain) {
  std::vector<float> xs;
  for (float x = -87.33f; x <= 88.0f; x += 1.0e-4f * (1.0f + std::fabs(x))) xs.push_back(x);
  xs.push_back(88.0f);
  const std::vector<float> vector_unit = exp_in_the_vector_unit(xs);
  int64_t worst = 0, worst_scalar = 0;
  float worst_at = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float reference = std::exp(xs[i]);
    if (ulps_apart(vector_unit[i], reference) > worst) worst = ulps_apart(vector_unit[i], reference), worst_at = xs[i];
    worst_scalar = std::max(worst_scalar, ulps_apart(exp_vectorizable(xs[i]), reference));
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_at << " (" << xs.size() << " points)";
  EXPECT_LE(worst_scalar, 2) << "the baseline build of the same function";
  EXPECT_EQ(exp_in_the_vector_unit({0.0f, -0.0f}), (std::vector<float>{1.0f, 1.0f}));
}

TEST(ExpVectorizable, FlushesBelowTheSmallestNormalAndKeepsInfinitiesAndNaN) {
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  const std::vector<float> xs{-87.34f, -1000.0f, -kInfinity, 88.5f, kInfinity, std::numeric_limits<float>::quiet_NaN(),
                              -87.336f};
  // Enough copies that every element is also taken by a full vector, not only by the tail.
  std::vector<float> repeated;
  for (int copy = 0; copy < 16; ++copy) repeated.insert(repeated.end(), xs.begin(), xs.end());
  const std::vector<float> e = exp_in_the_vector_unit(repeated);
  for (size_t i = 0; i < repeated.size(); i += xs.size()) {
    EXPECT_EQ(e[i + 0], 0.0f);
    EXPECT_EQ(e[i + 1], 0.0f);
    EXPECT_EQ(e[i + 2], 0.0f);
    EXPECT_EQ(e[i + 3], kInfinity);
    EXPECT_EQ(e[i + 4], kInfinity);
    EXPECT_TRUE(std::isnan(e[i + 5]));
    EXPECT_GE(e[i + 6], std::numeric_limits<float>::min());
  }
}

// Every tail length a 16-float vector can leave: the right values and nothing written past the end.
TEST(ExpShiftedInPlace, FollowsLibmForEveryTailLength) {
  for (int64_t count = 0; count <= 40; ++count) {
    std::vector<float> values(static_cast<size_t>(count) + 1, 123.0f);  // one past the end, untouched
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = -0.37f * static_cast<float>(i);
    exp_shifted_in_place(values.data(), count, 1.5f);
    for (int64_t i = 0; i < count; ++i)
      EXPECT_LE(ulps_apart(values[static_cast<size_t>(i)], std::exp(-0.37f * static_cast<float>(i) - 1.5f)), 2)
          << "count " << count << ", element " << i;
    EXPECT_EQ(values.back(), 123.0f) << "count " << count << " wrote past its end";
  }
}

// The thread count the tests asked for, put back however a test ends.
struct ThreadCountRestorer {
  int saved = omp_get_max_threads();
  ~ThreadCountRestorer() { omp_set_num_threads(saved); }
};

TEST(ForEachThreadRange, CoversTheRangeOnceInWholeVectorsInThreadOrder) {
  const ThreadCountRestorer restorer;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (int64_t count : {0, 1, 15, 16, 17, 100, 1000}) {
      std::vector<int> owner(static_cast<size_t>(count), -1), visits(static_cast<size_t>(count), 0);
      for_each_thread_range(count, [&](int64_t begin, int64_t end) {
        EXPECT_EQ(omp_get_num_threads(), threads) << "the team is smaller than asked: fewer splits tested";
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
}

}  // namespace
}  // namespace kiln
