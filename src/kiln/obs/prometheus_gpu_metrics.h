// PrometheusGpuMetrics: the state of the rank's GPU from NVML as gauges, labelled `gpu` (NVML's
// index of the device, as dcgm-exporter's `gpu` label), read again on every scrape so the
// training thread never calls NVML. Base units; dcgm-exporter's field of the same reading beside:
//   kiln_gpu_utilization_ratio              DCGM_FI_DEV_GPU_UTIL (percent there)
//   kiln_gpu_memory_copy_utilization_ratio  DCGM_FI_DEV_MEM_COPY_UTIL (percent there)
//   kiln_gpu_memory_used_bytes              DCGM_FI_DEV_FB_USED (MiB there)
//   kiln_gpu_memory_total_bytes             DCGM_FI_DEV_FB_TOTAL (MiB there)
//   kiln_gpu_power_watts                    DCGM_FI_DEV_POWER_USAGE
//   kiln_gpu_temperature_celsius            DCGM_FI_DEV_GPU_TEMP
//   kiln_gpu_sm_clock_hertz                 DCGM_FI_DEV_SM_CLOCK (MHz there)
//   kiln_gpu_memory_clock_hertz             DCGM_FI_DEV_MEM_CLOCK (MHz there)
// A reading NVML does not give on this GPU is not exported; one that stops coming keeps its last
// value. refresh() is called by the scrape's thread; the registry makes it safe beside the training
// thread.
#pragma once

#include <memory>
#include <string>

#include "kiln/obs/nvml_library.h"
#include "kiln/obs/prometheus_registry.h"

namespace kiln {

class PrometheusGpuMetrics {
 public:
  // Adds the gauges to `registry`, which must outlive this.
  PrometheusGpuMetrics(PrometheusRegistry& registry, std::unique_ptr<NvmlLibrary> nvml,
                       unsigned gpu);
  void refresh();
  unsigned gpu() const { return gpu_; }

 private:
  using Metric = PrometheusRegistry::Metric;

  PrometheusRegistry& registry_;
  std::unique_ptr<NvmlLibrary> nvml_;
  unsigned gpu_;
  Metric utilization_, memory_copy_utilization_, memory_used_, memory_total_, power_, temperature_,
      sm_clock_, memory_clock_;
};

}  // namespace kiln
