#include "kiln/obs/top_run.h"

#include <string_view>
#include <utility>

namespace kiln {

RunReading read_run(const std::vector<PrometheusSample>& samples) {
  using Field = std::optional<double> RunReading::*;
  static constexpr std::pair<std::string_view, Field> kFields[] = {
      {"kiln_iterations_total", &RunReading::iteration},
      {"kiln_train_iterations", &RunReading::train_iterations},
      {"kiln_lm_loss", &RunReading::lm_loss},
      {"kiln_validation_lm_loss", &RunReading::validation_lm_loss},
      {"kiln_learning_rate", &RunReading::learning_rate},
      {"kiln_tokens_per_second", &RunReading::tokens_per_second},
      {"kiln_model_flops_utilization_ratio", &RunReading::model_flops_utilization},
      {"kiln_skipped_iterations_total", &RunReading::skipped_iterations},
      {"kiln_data_wait_seconds_total", &RunReading::data_wait_seconds},
      {"kiln_iteration_duration_seconds_sum", &RunReading::step_seconds_sum},
      {"kiln_iteration_duration_seconds_count", &RunReading::step_count},
  };
  RunReading run;
  for (const PrometheusSample& sample : samples) {
    for (const auto& [name, field] : kFields) {
      if (sample.name != name || run.*field) continue;
      run.*field = sample.value;
      if (field != &RunReading::iteration) continue;
      if (const std::string* rank = sample.label("rank")) run.rank = *rank;
      if (const std::string* host = sample.label("host")) run.host = *host;
    }
  }
  return run;
}

RunPace run_pace(const RunReading& now, const RunReading* before) {
  if (!now.step_seconds_sum || !now.step_count) return {};
  double seconds = *now.step_seconds_sum, count = *now.step_count;
  double waited = now.data_wait_seconds.value_or(0);
  // The iterations since `before`; a run started again since then counts from zero.
  if (before != nullptr && before->step_seconds_sum && before->step_count &&
      *before->step_count < count) {
    seconds -= *before->step_seconds_sum;
    count -= *before->step_count;
    waited -= before->data_wait_seconds.value_or(0);
  }
  if (count <= 0) return {};
  RunPace pace;
  pace.step_seconds = seconds / count;
  if (now.data_wait_seconds && seconds > 0) pace.data_wait_fraction = waited / seconds;
  return pace;
}

}  // namespace kiln
