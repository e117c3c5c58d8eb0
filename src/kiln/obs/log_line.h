// The Megatron-LM log line, printed every log_interval iterations with values averaged over the
// interval (loss, time, throughput) or taken at its last iteration (learning rate, loss scale,
// grad norm, counters), in Megatron's field order:
//   iteration N/T | consumed samples: S | elapsed time per iteration (ms): X |
//   throughput per GPU (TFLOP/s/GPU): Y | tokens per second: Z | learning rate: L |
//   global batch size: G | lm loss: E | loss scale: K | grad norm: Q |
//   number of skipped iterations: A | number of nan iterations: B |
// and, with many ranks, kiln's
//   grads reduce wait (ms): W (ranks MIN-MAX, longest rank R) |
// (W this rank's, then the spread over the ranks: the longest wait is the ranks' skew plus what
// the backward did not hide), plus Megatron's validation lines. Writes to a FILE* (stdout by
// default).
#pragma once

#include <cstdio>
#include <string>

#include "kiln/obs/observer.h"

namespace kiln {

std::string format_log_line(const IterationStats& stats);
std::string format_validation_line(const ValidationStats& stats);

class LogLineObserver : public TrainObserver {
 public:
  explicit LogLineObserver(int64_t log_interval, std::FILE* out = stdout);
  void on_iteration(const IterationStats& stats) override;
  void on_validation(const ValidationStats& stats) override;
  void on_checkpoint(int64_t iteration, const std::string& dir) override;
  void on_message(const std::string& text) override;

 private:
  int64_t log_interval_;
  std::FILE* out_;
  IterationStats sum_;
  int64_t counted_ = 0;
};

}  // namespace kiln
