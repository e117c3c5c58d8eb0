// What `kiln top` shows of a training run: the numbers of one scrape of a rank's /metrics page
// (prometheus_observer.h names them), and the pace worked out from two scrapes in a row.
// Plain values, no I/O.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/obs/prometheus_text_parser.h"

namespace kiln {

// One scrape of one rank's page, in base units; a number is absent where the page lacks it (MFU
// off a GPU of the datasheet table, the validation loss before the first validation).
struct RunReading {
  std::string rank, host;           // the labels of kiln_iterations_total; empty when it has none
  std::optional<double> iteration;  // kiln_iterations_total
  std::optional<double> train_iterations;  // kiln_train_iterations
  std::optional<double> lm_loss, validation_lm_loss, learning_rate, tokens_per_second;
  std::optional<double> model_flops_utilization;  // a ratio
  std::optional<double> skipped_iterations;
  std::optional<double> data_wait_seconds;  // kiln_data_wait_seconds_total
  // kiln_iteration_duration_seconds' _sum and _count: this process's iterations.
  std::optional<double> step_seconds_sum, step_count;
};

// The first sample of each kiln metric on the page.
RunReading read_run(const std::vector<PrometheusSample>& samples);

// Seconds per iteration and the fraction of them spent waiting for data: over the iterations
// between `before` and `now` when there were some, else over all of `now`'s; absent without
// iterations.
struct RunPace {
  std::optional<double> step_seconds, data_wait_fraction;
};
RunPace run_pace(const RunReading& now, const RunReading* before);

}  // namespace kiln
