#include "kiln/obs/top_gpus.h"

#include <fstream>

namespace kiln {

TopGpus read_top_gpus(const NvmlLibrary& nvml) {
  TopGpus top;
  const std::optional<unsigned> count = nvml.device_count(top.none_because);
  if (count == 0u) top.none_because = "NVML sees no GPU";
  for (unsigned index = 0; index < count.value_or(0); ++index) {
    TopGpu& gpu = top.gpus.emplace_back();
    gpu.index = index;
    gpu.name = nvml.device_name(index);
    gpu.reading = nvml.read(index);
    const std::optional<std::vector<GpuProcessReading>> processes =
        nvml.compute_processes(index, gpu.processes_unknown);
    if (!processes) continue;
    for (const GpuProcessReading& process : *processes)
      gpu.processes.push_back({.pid = process.pid,
                               .name = process_name(process.pid),
                               .used_memory_bytes = process.used_memory_bytes});
  }
  return top;
}

std::string process_name(unsigned pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace kiln
