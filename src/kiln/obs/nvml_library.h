// NvmlLibrary: the few NVML calls kiln reads a GPU's state with (utilisation, memory, power,
// temperature, clocks) and lists the GPUs and their processes with (`kiln top`), from
// libnvidia-ml.so.1 loaded at run time with dlopen, so kiln neither links nor needs it: on a
// machine without NVIDIA's driver load() says why and nothing else changes. The signatures are
// NVML's documented ones (NVML API Reference, docs.nvidia.com/deploy/nvml-api/, and nvml.h),
// declared in nvml_library.cpp.
//
// NVML is thread-safe (its reference says so of every call), so every call may run on any thread.
// One NvmlLibrary holds one nvmlInit_v2 and ends it with nvmlShutdown on destruction.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// One reading of one GPU; a field is absent where NVML does not report it on that GPU
// (NVML_ERROR_NOT_SUPPORTED) or the call failed. Base units: ratios, bytes, watts, hertz.
struct GpuReading {
  std::optional<double> utilization_ratio;  // time a kernel ran, over NVML's sample period
  std::optional<double> memory_copy_utilization_ratio;  // time device memory was read or written
  // In use by every process; without what the driver reserves where NVML has
  // nvmlDeviceGetMemoryInfo_v2 (drivers from R510), as nvidia-smi shows it.
  std::optional<double> memory_used_bytes, memory_total_bytes;
  std::optional<double> power_watts;
  std::optional<double> temperature_celsius;  // the GPU die
  std::optional<double> sm_clock_hertz, memory_clock_hertz;
};

// A process with a compute context on a GPU, as NVML lists it.
struct GpuProcessReading {
  unsigned pid = 0;  // in the host's process ids: inside a container it may name no process there
  std::optional<double> used_memory_bytes;  // absent where NVML does not say (in some containers)
};

// The entry of CUDA_VISIBLE_DEVICES that CUDA device `ordinal` is ("3", "GPU-8f1e..."), or
// the ordinal itself when the variable is unset (`visible` null); nullopt when the list has no such
// entry. CUDA reads the list up to its first invalid entry; so does this.
std::optional<std::string> visible_device_entry(const char* visible, int ordinal);

class NvmlLibrary {
 public:
  // NVML loaded and initialised; nullptr with the reason in `why_not` (no libnvidia-ml.so.1, or
  // nvmlInit_v2's error) otherwise.
  static std::unique_ptr<NvmlLibrary> load(std::string& why_not);
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  // NVML's index of the GPU a CUDA_VISIBLE_DEVICES entry names (an index, or a full GPU UUID);
  // nullopt with the reason in `why_not` when NVML knows no such GPU (MIG instances included).
  std::optional<unsigned> device_index(std::string_view visible_entry, std::string& why_not) const;
  GpuReading read(unsigned device_index) const;

  // How many GPUs NVML sees: every GPU of the machine, whatever CUDA_VISIBLE_DEVICES says;
  // nullopt with NVML's reason in `why_not` when it cannot say.
  std::optional<unsigned> device_count(std::string& why_not) const;
  // The GPU's product name, "NVIDIA H100 80GB HBM3"; "" when NVML does not give it.
  std::string device_name(unsigned device_index) const;
  // The processes with a compute context on the GPU, from nvmlDeviceGetComputeRunningProcesses_v3
  // where the driver has it, else _v2, else the first version; nullopt with the reason in
  // `why_not` when NVML does not list them (NVML_ERROR_NO_PERMISSION, say).
  std::optional<std::vector<GpuProcessReading>> compute_processes(unsigned device_index,
                                                                  std::string& why_not) const;

 private:
  struct Api;  // the function pointers, nvml_library.cpp
  NvmlLibrary(void* handle, std::unique_ptr<Api> api);

  void* handle_;  // dlopen's
  std::unique_ptr<Api> api_;
};

}  // namespace kiln
