#include "kiln/obs/prometheus_endpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <utility>

namespace kiln {
namespace {

std::string this_host() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name : "localhost";
}

// The GPU of CUDA device `cuda_device` from NVML; null with the reason in `why_not` otherwise.
std::unique_ptr<PrometheusGpuMetrics> gpu_metrics(PrometheusRegistry& registry, int cuda_device,
                                                  std::string& why_not) {
  const std::optional<std::string> entry =
      visible_device_entry(std::getenv("CUDA_VISIBLE_DEVICES"), cuda_device);
  if (!entry) {
    why_not = fmt::format("CUDA_VISIBLE_DEVICES names no device {}", cuda_device);
    return nullptr;
  }
  std::unique_ptr<NvmlLibrary> nvml = NvmlLibrary::load(why_not);
  if (!nvml) return nullptr;
  const std::optional<unsigned> index = nvml->device_index(*entry, why_not);
  if (!index) return nullptr;
  return std::make_unique<PrometheusGpuMetrics>(registry, std::move(nvml), *index);
}

}  // namespace

PrometheusEndpoint::PrometheusEndpoint(const PrometheusEndpointOptions& options)
    : registry_({{"rank", std::to_string(options.rank)}, {"host", this_host()}}),
      observer_(registry_, options.training) {
  std::string gpu_note = "no GPU metrics: the run is on the CPU";
  if (options.cuda_device >= 0) {
    std::string why_not;
    gpu_ = gpu_metrics(registry_, options.cuda_device, why_not);
    gpu_note = gpu_ ? fmt::format("GPU {} from NVML", gpu_->gpu()) : "no GPU metrics: " + why_not;
  }
  server_ = std::make_unique<PrometheusServer>(options.address, options.port, [this] {
    if (gpu_) gpu_->refresh();
    return registry_.render();
  });
  description_ = fmt::format("Prometheus metrics: {} ({})", server_->url(), gpu_note);
}

}  // namespace kiln
