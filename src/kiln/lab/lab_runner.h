// Runs `kiln lab`'s rows (lab_plan.h) and measures them.
//
// measure_row() trains the row's configuration with the real Trainer for warm-up plus timed
// iterations (no validation, no checkpoint) and reports the median step, the samples per second
// of the global batch at that median, the peak of kiln's device memory, the share of the timed
// iterations' time spent waiting for batches, and the last loss. A row of several ranks is measured
// by `launch_ranks` (the command line starts that many processes, each calling measure_row() in the
// group they join, and returns rank 0's measurement).
//
// run_labs() measures every row that can run, lab by lab, in order, then lab 5 from labs 1-4's
// fastest rows, and sets each row's ratio to its lab's baseline (a lab whose baseline could not run
// has ratio 0 everywhere). A configuration that the Trainer refuses at construction (an fp8 shape,
// a precision the device lacks) makes that row unavailable with the Trainer's reason, and so does a
// row of several ranks whose processes fail (their messages go to stderr); an error during the
// timed steps of a one-rank row stops the lab with that error.
#pragma once

#include <functional>

#include "kiln/dist/communicator.h"
#include "kiln/lab/lab_plan.h"

namespace kiln {

struct LabRunOptions {
  int64_t warmup_iters = 2, timed_iters = 5;
  // Measures `config` on `ranks` processes; unset: rows of several ranks do not run.
  std::function<LabMeasurement(const Config& config, int ranks)> launch_ranks;
  // Told before each row runs (progress on the terminal); may be empty.
  std::function<void(const LabExperiment&, const LabRowResult&)> on_row;
};

LabMeasurement measure_row(const Config& config, int64_t warmup_iters, int64_t timed_iters,
                           Communicator* communicator = nullptr, int device_index = 0);

void run_labs(const Config& base, std::vector<LabExperiment>& labs, const LabRunOptions& options);

}  // namespace kiln
