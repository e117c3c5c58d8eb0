#include "kiln/obs/top_reader.h"

#include <utility>

namespace kiln {

TopReader::TopReader(std::vector<MetricsEndpoint> endpoints)
    : nvml_(NvmlLibrary::load(why_no_nvml_)),
      endpoints_(std::move(endpoints)),
      histories_(endpoints_.size()) {}

TopFrame TopReader::read(std::string title) {
  TopFrame frame;
  frame.title = std::move(title);
  frame.gpus = nvml_ ? read_top_gpus(*nvml_) : TopGpus{.gpus = {}, .none_because = why_no_nvml_};
  const std::vector<MetricsScrape> scrapes = scrape_metrics(endpoints_);
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    TopRun& run = frame.runs.emplace_back();
    run.endpoint = endpoints_[i].name();
    run.error = scrapes[i].error;
    RunHistory& history = histories_[i];
    if (!run.error.empty()) {
      history = {};
      continue;
    }
    run.reading = read_run(scrapes[i].samples);
    if (history.latest &&
        run.reading.step_count.value_or(0) > history.latest->step_count.value_or(0))
      history.before = history.latest;
    run.pace = run_pace(run.reading, history.before ? &*history.before : nullptr);
    history.latest = run.reading;
  }
  return frame;
}

}  // namespace kiln
