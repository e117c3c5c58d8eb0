#include "kiln/obs/prometheus_gpu_metrics.h"

#include <optional>
#include <utility>

namespace kiln {

PrometheusGpuMetrics::PrometheusGpuMetrics(PrometheusRegistry& registry,
                                           std::unique_ptr<NvmlLibrary> nvml, unsigned gpu)
    : registry_(registry),
      nvml_(std::move(nvml)),
      gpu_(gpu),
      utilization_(registry.add_gauge(
          "kiln_gpu_utilization_ratio",
          "Fraction of NVML's last sample period in which a kernel ran on the GPU.")),
      memory_copy_utilization_(registry.add_gauge(
          "kiln_gpu_memory_copy_utilization_ratio",
          "Fraction of NVML's last sample period in which the GPU's memory was read or written.")),
      memory_used_(registry.add_gauge("kiln_gpu_memory_used_bytes",
                                      "GPU memory in use by every process, in bytes (without what "
                                      "the driver reserves, as nvidia-smi shows it).")),
      memory_total_(
          registry.add_gauge("kiln_gpu_memory_total_bytes", "GPU memory in all, in bytes.")),
      power_(registry.add_gauge("kiln_gpu_power_watts", "Power the GPU draws, in watts.")),
      temperature_(registry.add_gauge("kiln_gpu_temperature_celsius",
                                      "GPU die temperature, in degrees Celsius.")),
      sm_clock_(registry.add_gauge("kiln_gpu_sm_clock_hertz",
                                   "Clock of the GPU's streaming multiprocessors, in hertz.")),
      memory_clock_(registry.add_gauge("kiln_gpu_memory_clock_hertz",
                                       "Clock of the GPU's memory, in hertz.")) {}

void PrometheusGpuMetrics::refresh() {
  const GpuReading reading = nvml_->read(gpu_);
  const PrometheusRegistry::Labels labels{{"gpu", std::to_string(gpu_)}};
  for (const auto& [metric, value] :
       {std::pair{utilization_, reading.utilization_ratio},
        {memory_copy_utilization_, reading.memory_copy_utilization_ratio},
        {memory_used_, reading.memory_used_bytes},
        {memory_total_, reading.memory_total_bytes},
        {power_, reading.power_watts},
        {temperature_, reading.temperature_celsius},
        {sm_clock_, reading.sm_clock_hertz},
        {memory_clock_, reading.memory_clock_hertz}})
    if (value) registry_.set(metric, *value, labels);
}

}  // namespace kiln
