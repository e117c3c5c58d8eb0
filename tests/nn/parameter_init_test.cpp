#include "kiln/nn/parameter_init.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <span>

namespace kiln {
namespace {

// Every matrix from N(0, 0.5^2), every vector at 1.
InitialValues matrices_drawn(const ParameterInfo& entry) {
  return entry.shape.rank == 2 ? InitialValues{0.0f, 0.5f} : InitialValues{1.0f};
}

std::span<const float> values_of(const std::vector<float>& host, const ParameterLayout& layout, const char* name) {
  const ParameterInfo& info = layout.find(name);
  return {host.data() + info.offset, static_cast<size_t>(info.shape.numel())};
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST(ParameterInit, ATensorsDrawsDependOnTheSeedAndItsNameNotOnTheOtherTensors) {
  ParameterLayout alone;
  alone.add("blocks.0.weight", {48, 40}, true);
  ParameterLayout grown;  // a tensor more, before it, and one after
  grown.add("embeddings.extra.weight", {2, 40}, true);
  grown.add("blocks.0.weight", {48, 40}, true);
  grown.add("blocks.0.bias", {40}, false);
  const std::vector<float> a = initial_parameters(alone, 7, matrices_drawn);
  const std::vector<float> b = initial_parameters(grown, 7, matrices_drawn);
  EXPECT_TRUE(same_bits(values_of(a, alone, "blocks.0.weight"), values_of(b, grown, "blocks.0.weight")));

  const std::vector<float> reseeded = initial_parameters(alone, 8, matrices_drawn);
  EXPECT_FALSE(same_bits(values_of(a, alone, "blocks.0.weight"), values_of(reseeded, alone, "blocks.0.weight")));
  ParameterLayout renamed;
  renamed.add("blocks.1.weight", {48, 40}, true);
  const std::vector<float> c = initial_parameters(renamed, 7, matrices_drawn);
  EXPECT_FALSE(same_bits(values_of(a, alone, "blocks.0.weight"), values_of(c, renamed, "blocks.1.weight")));
  for (float v : values_of(b, grown, "blocks.0.bias")) EXPECT_EQ(v, 1.0f);
}

TEST(ParameterInit, TheDrawsAreTheSameOnAnyNumberOfThreadsAndAcrossChunks) {
  ParameterLayout layout;
  layout.add("wide.weight", {1031, 1021}, true);  // four chunks of work, the last one partial
  layout.add("narrow.weight", {3, 5}, true);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = initial_parameters(layout, 3, matrices_drawn);
  omp_set_num_threads(4);
  const std::vector<float> four = initial_parameters(layout, 3, matrices_drawn);
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(one, four));
  // Element i is the stream's i-th draw however long the tensor: a short tensor of the same name
  // holds the long one's first elements.
  ParameterLayout short_one;
  short_one.add("wide.weight", {1, 13}, true);
  const std::vector<float> prefix = initial_parameters(short_one, 3, matrices_drawn);
  EXPECT_TRUE(same_bits(prefix, values_of(one, layout, "wide.weight").first(13)));
}

TEST(ParameterInit, DrawsAreNormalWithTheRulesDeviationAndStopAtItsCount) {
  ParameterLayout layout;
  layout.add("table.weight", {400, 500}, true);
  const int64_t drawn = 390 * 500;  // the last ten rows stay at the constant (padding rows)
  const std::vector<float> host = initial_parameters(
      layout, 11, [&](const ParameterInfo&) { return InitialValues{0.25f, 0.02f, drawn}; });
  double sum = 0, squares = 0, fourth = 0;
  int64_t beyond_two = 0;
  for (int64_t i = 0; i < drawn; ++i) {
    const double z = host[static_cast<size_t>(i)] / 0.02;
    sum += z;
    squares += z * z;
    fourth += z * z * z * z;
    beyond_two += std::abs(z) > 2.0;
  }
  const double n = static_cast<double>(drawn);
  EXPECT_NEAR(sum / n, 0.0, 0.01);            // the mean's standard error is 1 / sqrt(195000) = 0.0023
  EXPECT_NEAR(squares / n, 1.0, 0.015);       // the variance's, sqrt(2 / n) = 0.0032
  EXPECT_NEAR(fourth / n, 3.0, 0.1);          // a normal's kurtosis
  EXPECT_NEAR(beyond_two / n, 0.0455, 0.003);  // P(|z| > 2)
  for (int64_t i = drawn; i < 400 * 500; ++i) ASSERT_EQ(host[static_cast<size_t>(i)], 0.25f) << i;
}

}  // namespace
}  // namespace kiln
