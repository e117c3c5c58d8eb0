// PrometheusEndpoint: everything --metrics-port turns on for one rank, and nothing exists without
// it. A registry labelled with the rank and host, the PrometheusObserver filling it from the
// Trainer's events, the rank's GPU from NVML when NVML loads (prometheus_gpu_metrics.h; read at
// each scrape), and a PrometheusServer answering GET /metrics on address:port from the
// construction on. docs/prometheus.md lists the metrics.
//
// Construction throws a kiln::Error naming address:port when the port cannot be had (in use, not
// permitted), so a run fails before its first step. Nothing may call the observer once this is
// destroyed; destruction stops serving.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/obs/prometheus_gpu_metrics.h"
#include "kiln/obs/prometheus_observer.h"
#include "kiln/obs/prometheus_registry.h"
#include "kiln/obs/prometheus_server.h"

namespace kiln {

struct PrometheusEndpointOptions {
  std::string address = "127.0.0.1";
  int port = 0;          // this rank's: --metrics-port + local rank; 0 takes a free one (tests)
  int64_t rank = 0;      // the `rank` label: the global rank
  int cuda_device = -1;  // the rank's CUDA device ordinal, whose GPU NVML reports; -1: no GPU
  PrometheusObserverOptions training;
};

class PrometheusEndpoint {
 public:
  explicit PrometheusEndpoint(const PrometheusEndpointOptions& options);

  TrainObserver& observer() { return observer_; }
  int port() const { return server_->port(); }
  // One line for the run's log: where the metrics are, and whether the GPU's are among them.
  const std::string& description() const { return description_; }

 private:
  PrometheusRegistry registry_;
  PrometheusObserver observer_;
  std::unique_ptr<PrometheusGpuMetrics> gpu_;  // null: no GPU, or NVML not loaded
  std::unique_ptr<PrometheusServer> server_;   // last: stops serving before the rest goes
  std::string description_;
};

}  // namespace kiln
