// Where the readings of a `kiln top` frame come from: NVML's GPUs (NVML loaded once, here; its
// reason kept when it does not load) and the runs' /metrics pages, scraped at every read. A run's
// pace (top_run.h) is over its iterations since the read before its last advance, so it stays
// steady when reads come faster than iterations.
//
// For one thread. A read blocks for the scrapes: milliseconds on a live run, about a second at
// worst for an endpoint that does not answer (metrics_scrape.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/obs/metrics_scrape.h"
#include "kiln/obs/nvml_library.h"
#include "kiln/obs/top_frame.h"

namespace kiln {

class TopReader {
 public:
  explicit TopReader(std::vector<MetricsEndpoint> endpoints);

  TopFrame read(std::string title);

 private:
  // NvmlLibrary::load's reason; declared before nvml_, whose initialiser fills it.
  std::string why_no_nvml_;
  std::unique_ptr<NvmlLibrary> nvml_;
  std::vector<MetricsEndpoint> endpoints_;
  struct RunHistory {
    std::optional<RunReading> latest;  // of the last read
    std::optional<RunReading> before;  // of the last read before the iterations last advanced
  };
  std::vector<RunHistory> histories_;  // one per endpoint
};

}  // namespace kiln
