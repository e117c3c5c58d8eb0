// ConfusionMatrix: accuracy, F1 as scikit-learn's f1_score computes it (binary: label 1's; more
// labels: the unweighted mean), and bad labels named.
#include "kiln/nn/classification_metrics.h"

#include <gtest/gtest.h>

#include "support/error_of.h"

namespace kiln {
namespace {

TEST(ConfusionMatrix, BinaryScoresAreTheStandardOnes) {
  ConfusionMatrix counts(2);
  // 3 true positives, 1 false positive, 2 false negatives, 4 true negatives.
  for (int i = 0; i < 3; ++i) counts.add(1, 1);
  counts.add(0, 1);
  for (int i = 0; i < 2; ++i) counts.add(1, 0);
  for (int i = 0; i < 4; ++i) counts.add(0, 0);
  EXPECT_EQ(counts.total(), 10.0);
  EXPECT_DOUBLE_EQ(counts.accuracy(), 0.7);
  // precision 3/4, recall 3/5: F1 = 2 x 3 / (2 x 3 + 1 + 2) = 2/3.
  EXPECT_DOUBLE_EQ(counts.f1(), 2.0 / 3.0);
}

TEST(ConfusionMatrix, ManyLabelsAverageEachLabelsF1) {
  ConfusionMatrix counts(3);
  counts.add(0, 0);
  counts.add(1, 1);
  counts.add(2, 1);  // label 2 never predicted: its F1 is 0
  // F1: label 0 1, label 1 2/3, label 2 0.
  EXPECT_DOUBLE_EQ(counts.f1(), (1.0 + 2.0 / 3.0 + 0.0) / 3.0);
  EXPECT_DOUBLE_EQ(counts.accuracy(), 2.0 / 3.0);
}

TEST(ConfusionMatrix, NothingCountedScoresZeroAndBadLabelsAreNamed) {
  ConfusionMatrix counts(2);
  EXPECT_EQ(counts.accuracy(), 0.0);
  EXPECT_EQ(counts.f1(), 0.0);
  EXPECT_NE(testing::error_of([&] { counts.add(2, 0); }).find("label 2 is outside [0, 2)"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { counts.add(0, -1); }).find("prediction -1 is outside [0, 2)"), std::string::npos);
}

}  // namespace
}  // namespace kiln
