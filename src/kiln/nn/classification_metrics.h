// ConfusionMatrix: the (label, prediction) pairs of a classifier's evaluation, counted, and the
// metrics its validation reports.
//   accuracy  correct / all samples
//   F1        per label 2 TP / (2 TP + FP + FN) (0 when the label is neither present nor
//             predicted); with two labels, label 1's (the positive class: spam), scikit-learn's
//             f1_score default; with more, the unweighted mean over the labels (average="macro").
// The counts are doubles in one vector, so ranks sum them with one all-reduce (exact below 2^53).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

class ConfusionMatrix {
 public:
  explicit ConfusionMatrix(int64_t labels = 0);

  int64_t labels() const { return labels_; }
  // Throws naming the value when a label or prediction is outside [0, labels).
  void add(int32_t label, int32_t predicted);
  // counts()[label x labels + predicted]: how many samples of `label` were predicted `predicted`.
  std::vector<double>& counts() { return counts_; }
  const std::vector<double>& counts() const { return counts_; }
  double total() const;
  double accuracy() const;  // 0 when nothing was counted
  double f1() const;

 private:
  double f1_of(int64_t label) const;
  int64_t labels_;
  std::vector<double> counts_;
};

}  // namespace kiln
