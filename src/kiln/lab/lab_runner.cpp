#include "kiln/lab/lab_runner.h"

#include <algorithm>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/train/trainer.h"

namespace kiln {
namespace {

class StepRecorder : public TrainObserver {
 public:
  void on_iteration(const IterationStats& stats) override { steps.push_back(stats); }
  std::vector<IterationStats> steps;
};

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

Config measured_config(Config config, int64_t warmup_iters, int64_t timed_iters) {
  config.train_iters = warmup_iters + timed_iters;
  config.disable_validation();
  config.save.clear();
  config.save_interval = 0;
  config.load.clear();
  return config;
}

// Runs the trainer to its end; the iterations after `warmup_iters` are the measured ones.
LabMeasurement measure_trainer(Trainer& trainer, int64_t warmup_iters) {
  StepRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  KILN_CHECK(static_cast<int64_t>(recorder.steps.size()) > warmup_iters,
             "kiln lab: the run ended after {} iterations, before its timed ones", recorder.steps.size());
  const std::vector<IterationStats> timed(recorder.steps.begin() + warmup_iters, recorder.steps.end());
  std::vector<double> ms;
  double elapsed = 0, waited = 0;
  for (const IterationStats& step : timed) {
    ms.push_back(step.elapsed_ms);
    elapsed += step.elapsed_ms;
    waited += step.data_wait_ms;
  }
  LabMeasurement measured;
  measured.step_ms = median(ms);
  measured.samples_per_second =
      static_cast<double>(trainer.config().global_batch_size) / (measured.step_ms * 1e-3);
  measured.peak_memory_bytes = timed.back().memory_max_allocated_bytes;
  measured.data_wait_share = elapsed > 0 ? waited / elapsed : 0.0;
  measured.final_loss = timed.back().lm_loss;
  return measured;
}

// The row measured, or the reason its configuration cannot run (the Trainer's refusal).
void measure(const Config& base, LabRowResult& row, const LabRunOptions& options) {
  const Config config = measured_config(with_settings(base, row), options.warmup_iters, options.timed_iters);
  if (row.ranks > 1) {
    if (!options.launch_ranks) {
      row.unavailable = "no launcher for several ranks";
      return;
    }
    try {
      row.measured = options.launch_ranks(config, row.ranks);
    } catch (const Error& failure) {  // the ranks' own messages are on stderr above
      row.unavailable = failure.what();
    }
    return;
  }
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(config);
  } catch (const Error& refusal) {
    row.unavailable = refusal.what();
    return;
  }
  row.measured = measure_trainer(*trainer, options.warmup_iters);
}

}  // namespace

LabMeasurement measure_row(const Config& config, int64_t warmup_iters, int64_t timed_iters, Communicator* communicator,
                           int device_index) {
  KILN_CHECK(warmup_iters >= 0 && timed_iters > 0, "kiln lab: --warmup-iters must be >= 0 and --timed-iters positive");
  Trainer trainer(measured_config(config, warmup_iters, timed_iters), communicator, device_index);
  return measure_trainer(trainer, warmup_iters);
}

void run_labs(const Config& base, std::vector<LabExperiment>& labs, const LabRunOptions& options) {
  KILN_CHECK(options.warmup_iters >= 0 && options.timed_iters > 0,
             "kiln lab: --warmup-iters must be >= 0 and --timed-iters positive");
  const auto run_rows = [&](LabExperiment& lab) {
    for (LabRowResult& row : lab.rows) {
      if (!row.unavailable.empty()) continue;
      if (options.on_row) options.on_row(lab, row);
      measure(base, row, options);
    }
    const auto baseline = std::find_if(lab.rows.begin(), lab.rows.end(), [](const auto& r) { return r.baseline; });
    const double reference =
        baseline != lab.rows.end() && baseline->measured ? baseline->measured->samples_per_second : 0.0;
    for (LabRowResult& row : lab.rows)
      if (row.measured) row.measured->ratio = reference > 0 ? row.measured->samples_per_second / reference : 0.0;
  };
  for (LabExperiment& lab : labs)
    if (lab.number != 5) run_rows(lab);
  for (LabExperiment& lab : labs)
    if (lab.number == 5) {
      lab = plan_all_together(labs);
      run_rows(lab);
    }
}

}  // namespace kiln
