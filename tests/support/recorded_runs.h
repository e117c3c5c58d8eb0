// Whole training runs in tests: a Trainer run to its end with every iteration's stats kept, the
// largest difference between two runs' losses, the bytes of a file it wrote, the check that a
// resumed run matches, the check that recomputation changes no bit, and the fixture of the end-to-end precision tests (one back-end per
// parameter, skipped with its reason where absent, a toy dataset of 61 token ids to learn).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln/train/trainer.h"
#include "support/backends.h"
#include "support/temp_dir.h"

namespace kiln::testing {

// Keeps every iteration's and every validation's stats, in order.
class IterationRecorder : public TrainObserver {
 public:
  void on_iteration(const IterationStats& stats) override { iterations.push_back(stats); }
  void on_validation(const ValidationStats& stats) override { validations.push_back(stats); }
  std::vector<IterationStats> iterations;
  std::vector<ValidationStats> validations;
};

inline std::vector<IterationStats> train_and_record(const Config& config) {
  Trainer trainer(config);
  IterationRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  return recorder.iterations;
}

// The largest difference between two runs' losses, iteration by iteration; +inf where either loss
// is not a number (a NaN difference would otherwise vanish in a max) or the runs differ in length.
inline double largest_loss_difference(const std::vector<IterationStats>& a, const std::vector<IterationStats>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return INFINITY;
  double largest = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double difference = std::abs(a[i].lm_loss - b[i].lm_loss);
    if (std::isnan(difference)) return INFINITY;
    largest = std::max(largest, difference);
  }
  return largest;
}

// A run resumed from iteration `resumed_at` goes on exactly as the uninterrupted one did: the same
// losses and gradient norms, bit for bit (resumed_at 0: two whole runs that must agree).
inline void expect_resumed_bit_for_bit(const std::vector<IterationStats>& resumed,
                                       const std::vector<IterationStats>& full, size_t resumed_at) {
  ASSERT_EQ(resumed.size() + resumed_at, full.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].lm_loss, full[resumed_at + i].lm_loss)
        << "iteration " << resumed_at + i + 1;
    EXPECT_EQ(resumed[i].grad_norm, full[resumed_at + i].grad_norm)
        << "iteration " << resumed_at + i + 1;
  }
}

// `config` run as it is, then with full and with selective recomputation: the same losses and
// gradient norms, bit for bit. Returns the run as it is.
inline std::vector<IterationStats> expect_recomputation_changes_no_bit(const Config& config) {
  const std::vector<IterationStats> direct = train_and_record(config);
  Config full = config;
  full.recompute_granularity = "full";
  full.recompute_method = "uniform";
  expect_resumed_bit_for_bit(train_and_record(full), direct, 0);
  Config selective = config;
  selective.recompute_granularity = "selective";
  expect_resumed_bit_for_bit(train_and_record(selective), direct, 0);
  return direct;
}

class ToyDataRunTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
    write_toy_dataset(dir_.path(), 61, 20000, 2000);
  }
  TempDir dir_;
};

}  // namespace kiln::testing
