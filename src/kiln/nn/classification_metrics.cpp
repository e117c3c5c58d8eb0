#include "kiln/nn/classification_metrics.h"

#include "kiln/core/error.h"

namespace kiln {

ConfusionMatrix::ConfusionMatrix(int64_t labels)
    : labels_(labels), counts_(static_cast<size_t>(labels * labels), 0.0) {}

void ConfusionMatrix::add(int32_t label, int32_t predicted) {
  KILN_CHECK(label >= 0 && label < labels_, "label {} is outside [0, {})", label, labels_);
  KILN_CHECK(predicted >= 0 && predicted < labels_, "prediction {} is outside [0, {})", predicted, labels_);
  counts_[static_cast<size_t>(label * labels_ + predicted)] += 1.0;
}

double ConfusionMatrix::total() const {
  double sum = 0.0;
  for (const double count : counts_) sum += count;
  return sum;
}

double ConfusionMatrix::accuracy() const {
  double correct = 0.0;
  for (int64_t label = 0; label < labels_; ++label) correct += counts_[static_cast<size_t>(label * labels_ + label)];
  const double all = total();
  return all > 0.0 ? correct / all : 0.0;
}

double ConfusionMatrix::f1_of(int64_t label) const {
  double true_positive = 0.0, predicted = 0.0, actual = 0.0;
  for (int64_t other = 0; other < labels_; ++other) {
    predicted += counts_[static_cast<size_t>(other * labels_ + label)];
    actual += counts_[static_cast<size_t>(label * labels_ + other)];
  }
  true_positive = counts_[static_cast<size_t>(label * labels_ + label)];
  const double denominator = predicted + actual;  // 2 TP + FP + FN
  return denominator > 0.0 ? 2.0 * true_positive / denominator : 0.0;
}

double ConfusionMatrix::f1() const {
  if (labels_ == 2) return f1_of(1);
  if (labels_ == 0) return 0.0;
  double sum = 0.0;
  for (int64_t label = 0; label < labels_; ++label) sum += f1_of(label);
  return sum / static_cast<double>(labels_);
}

}  // namespace kiln
