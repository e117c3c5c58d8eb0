// What a run measured, summed up from its TensorBoard history (run_report_history.h) for the
// header and the predicted-versus-measured table of `kiln report`. The tags are
// tensorboard_observer.h's (Megatron's). A quantity whose tags the run did not write is nullopt;
// the flag that writes them is the reader's to name.
//
// Means skip the first logged point, which holds the first iteration's warm-up (allocations,
// cuBLAS' choices, cold caches), unless it is the only one. Pure, thread-safe.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/obs/run_report_history.h"

namespace kiln {

struct RunMeasured {
  std::optional<ScalarPoint> first_loss, last_loss;  // `lm loss`: its first and last iterations
  std::optional<ScalarPoint> last_validation_loss;   // `lm loss validation`
  std::optional<int64_t> samples;                    // the last step of `lm loss vs samples`
  std::optional<double> seconds_per_iteration;       // the mean `iteration-time`
  std::optional<double> tflops_per_gpu;              // the mean `throughput`
  std::optional<double> tokens_per_second;           // tokens_per_iteration / seconds_per_iteration
  std::optional<double> peak_memory_bytes;           // the largest `mem-max-allocated-bytes`
  std::optional<double> peak_device_memory_bytes;    // the largest `mem-reserved-bytes`
};

// `tokens_per_iteration`: from the run's estimate record; 0 when unknown (then no tokens/s).
RunMeasured measure_run(const RunHistory& history, int64_t tokens_per_iteration);

}  // namespace kiln
