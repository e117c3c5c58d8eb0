#include "kiln/obs/nvml_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <type_traits>

namespace kiln {
namespace {

// NVML's types as nvml.h declares them (NVML API Reference, "Device Queries" and "Initialization"):
//   nvmlReturn_t                 an enum, NVML_SUCCESS = 0
//   nvmlDevice_t                 struct nvmlDevice_st*, opaque
//   nvmlUtilization_t            { unsigned int gpu; unsigned int memory; }, percent
//   nvmlMemory_t                 { unsigned long long total; unsigned long long free; unsigned long
//   long used; }, bytes nvmlMemory_v2_t              { unsigned int version; unsigned long long
//   total, reserved, free, used; }, bytes,
//                                version nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof |
//                                2 << 24
//   nvmlTemperatureSensors_t     an enum, NVML_TEMPERATURE_GPU = 0
//   nvmlClockType_t              an enum, NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1,
//   NVML_CLOCK_MEM = 2
//   nvmlProcessInfo_v1_t         { unsigned int pid; unsigned long long usedGpuMemory; }, what
//                                nvmlDeviceGetComputeRunningProcesses (the first version) fills
//   nvmlProcessInfo_v2_t         the same, then { unsigned int gpuInstanceId, computeInstanceId; }:
//                                what its _v2 fills; _v3 fills nvmlProcessInfo_t, laid out alike
//   NVML_VALUE_NOT_AVAILABLE     (unsigned long long)-1, usedGpuMemory where NVML cannot say
//   NVML_ERROR_INSUFFICIENT_SIZE 7, with the count needed written back
//   NVML_DEVICE_NAME_V2_BUFFER_SIZE  96, room for any name nvmlDeviceGetName gives
// The enums are int-sized, so they pass as int.
using NvmlReturn = int;
struct NvmlDeviceHandle;
using NvmlDevice = NvmlDeviceHandle*;
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlMemoryV2 {
  unsigned int version = 0;
  unsigned long long total = 0, reserved = 0, free = 0, used = 0;
};
static_assert(sizeof(NvmlMemoryV2) == 40,
              "nvmlMemory_v2_t: the version padded to 8 bytes, four 8-byte counts");
constexpr unsigned int kNvmlMemoryV2 = sizeof(NvmlMemoryV2) | 2U << 24;
struct NvmlProcessInfoV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct NvmlProcessInfoV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};
static_assert(sizeof(NvmlProcessInfoV1) == 16 && sizeof(NvmlProcessInfoV2) == 24,
              "nvmlProcessInfo_v1_t and _v2_t as nvml.h lays them out");
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
constexpr size_t kNvmlDeviceNameSize = 96;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr int kTemperatureGpu = 0;
constexpr int kClockSm = 1, kClockMemory = 2;

}  // namespace

// Each pointer is the documented function of the name beside it.
struct NvmlLibrary::Api {
  NvmlReturn (*init)();                                      // nvmlInit_v2(void)
  NvmlReturn (*shutdown)();                                  // nvmlShutdown(void)
  const char* (*error_string)(NvmlReturn);                   // nvmlErrorString(nvmlReturn_t)
  NvmlReturn (*handle_by_index)(unsigned int, NvmlDevice*);  // nvmlDeviceGetHandleByIndex_v2
  NvmlReturn (*handle_by_uuid)(const char*, NvmlDevice*);    // nvmlDeviceGetHandleByUUID
  NvmlReturn (*index)(NvmlDevice, unsigned int*);            // nvmlDeviceGetIndex
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);   // nvmlDeviceGetUtilizationRates
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);             // nvmlDeviceGetMemoryInfo
  NvmlReturn (*memory_v2)(NvmlDevice,
                          NvmlMemoryV2*);  // nvmlDeviceGetMemoryInfo_v2, null before R510
  NvmlReturn (*power_milliwatts)(NvmlDevice, unsigned int*);          // nvmlDeviceGetPowerUsage
  NvmlReturn (*temperature_celsius)(NvmlDevice, int, unsigned int*);  // nvmlDeviceGetTemperature
  NvmlReturn (*clock_megahertz)(NvmlDevice, int, unsigned int*);      // nvmlDeviceGetClockInfo
  NvmlReturn (*count)(unsigned int*);                                 // nvmlDeviceGetCount_v2
  NvmlReturn (*name)(NvmlDevice, char*, unsigned int);                // nvmlDeviceGetName
  // nvmlDeviceGetComputeRunningProcesses_v3, _v2 and the first version; null where the driver
  // lacks one (older drivers have only the first).
  NvmlReturn (*processes_v3)(NvmlDevice, unsigned int*, NvmlProcessInfoV2*);
  NvmlReturn (*processes_v2)(NvmlDevice, unsigned int*, NvmlProcessInfoV2*);
  NvmlReturn (*processes_v1)(NvmlDevice, unsigned int*, NvmlProcessInfoV1*);
};

namespace {

// Calls a process-listing `function` until its list fits: processes may start between the call
// that counts them and the one that fills the list, and NVML then asks for more room again.
template <typename Info>
NvmlReturn list_processes(NvmlReturn (*function)(NvmlDevice, unsigned int*, Info*),
                          NvmlDevice device, std::vector<GpuProcessReading>& processes) {
  constexpr int kAttempts = 4;
  constexpr unsigned kSpare = 8;  // room for a few that start meanwhile
  std::vector<Info> infos(kSpare);
  NvmlReturn status = kNvmlInsufficientSize;
  for (int attempt = 0; attempt < kAttempts && status == kNvmlInsufficientSize; ++attempt) {
    unsigned count = static_cast<unsigned>(infos.size());
    status = function(device, &count, infos.data());
    if (status == kNvmlSuccess) infos.resize(count);
    if (status == kNvmlInsufficientSize) infos.resize(count + kSpare);
  }
  if (status != kNvmlSuccess) return status;
  for (const Info& info : infos) {
    GpuProcessReading& process = processes.emplace_back();
    process.pid = info.pid;
    if (info.used_gpu_memory != kNvmlValueNotAvailable)
      process.used_memory_bytes = static_cast<double>(info.used_gpu_memory);
  }
  return status;
}

}  // namespace

std::optional<std::string> visible_device_entry(const char* visible, int ordinal) {
  if (ordinal < 0) return std::nullopt;
  if (visible == nullptr) return std::to_string(ordinal);
  std::string_view rest = visible;
  for (int entry = 0;; ++entry) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const bool index = !item.empty() && std::all_of(item.begin(), item.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (!index && !item.starts_with("GPU-") && !item.starts_with("MIG-")) return std::nullopt;
    if (entry == ordinal) return std::string(item);
    if (comma == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(comma + 1);
  }
}

std::unique_ptr<NvmlLibrary> NvmlLibrary::load(std::string& why_not) {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    why_not = fmt::format("NVML is not loaded: {}", dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  auto resolve = [&](auto& function, const char* symbol) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, symbol));
    if (function == nullptr && missing == nullptr) missing = symbol;
  };
  resolve(api->init, "nvmlInit_v2");
  resolve(api->shutdown, "nvmlShutdown");
  resolve(api->error_string, "nvmlErrorString");
  resolve(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  resolve(api->handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  resolve(api->index, "nvmlDeviceGetIndex");
  resolve(api->utilization, "nvmlDeviceGetUtilizationRates");
  resolve(api->memory, "nvmlDeviceGetMemoryInfo");
  resolve(api->power_milliwatts, "nvmlDeviceGetPowerUsage");
  resolve(api->temperature_celsius, "nvmlDeviceGetTemperature");
  resolve(api->clock_megahertz, "nvmlDeviceGetClockInfo");
  resolve(api->count, "nvmlDeviceGetCount_v2");
  resolve(api->name, "nvmlDeviceGetName");
  api->memory_v2 =
      reinterpret_cast<decltype(api->memory_v2)>(dlsym(handle, "nvmlDeviceGetMemoryInfo_v2"));
  api->processes_v3 = reinterpret_cast<decltype(api->processes_v3)>(
      dlsym(handle, "nvmlDeviceGetComputeRunningProcesses_v3"));
  api->processes_v2 = reinterpret_cast<decltype(api->processes_v2)>(
      dlsym(handle, "nvmlDeviceGetComputeRunningProcesses_v2"));
  api->processes_v1 = reinterpret_cast<decltype(api->processes_v1)>(
      dlsym(handle, "nvmlDeviceGetComputeRunningProcesses"));
  if (missing != nullptr) {
    why_not = fmt::format("NVML is not loaded: libnvidia-ml.so.1 has no {}", missing);
    dlclose(handle);
    return nullptr;
  }
  if (const NvmlReturn status = api->init(); status != kNvmlSuccess) {
    why_not = fmt::format("NVML is not loaded: nvmlInit_v2: {}", api->error_string(status));
    dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<NvmlLibrary>(new NvmlLibrary(handle, std::move(api)));
}

NvmlLibrary::NvmlLibrary(void* handle, std::unique_ptr<Api> api)
    : handle_(handle), api_(std::move(api)) {}

NvmlLibrary::~NvmlLibrary() {
  api_->shutdown();
  dlclose(handle_);
}

std::optional<unsigned> NvmlLibrary::device_index(std::string_view visible_entry,
                                                  std::string& why_not) const {
  if (visible_entry.starts_with("MIG-")) {
    why_not = fmt::format("GPU {} is a MIG instance, which kiln does not report", visible_entry);
    return std::nullopt;
  }
  const std::string entry(visible_entry);
  NvmlDevice device = nullptr;
  NvmlReturn status = kNvmlSuccess;
  unsigned index = 0;
  if (entry.starts_with("GPU-")) {
    status = api_->handle_by_uuid(entry.c_str(), &device);
  } else {
    const auto [end, parsed] = std::from_chars(entry.data(), entry.data() + entry.size(), index);
    if (parsed != std::errc() || end != entry.data() + entry.size()) {
      why_not = fmt::format("'{}' names no GPU", entry);
      return std::nullopt;
    }
    status = api_->handle_by_index(index, &device);
  }
  if (status == kNvmlSuccess) status = api_->index(device, &index);
  if (status != kNvmlSuccess) {
    why_not = fmt::format("NVML does not know GPU {}: {}", entry, api_->error_string(status));
    return std::nullopt;
  }
  return index;
}

GpuReading NvmlLibrary::read(unsigned device_index) const {
  GpuReading reading;
  NvmlDevice device = nullptr;
  if (api_->handle_by_index(device_index, &device) != kNvmlSuccess) return reading;
  if (NvmlUtilization rates{}; api_->utilization(device, &rates) == kNvmlSuccess) {
    reading.utilization_ratio = rates.gpu / 100.0;
    reading.memory_copy_utilization_ratio = rates.memory / 100.0;
  }
  // The v2 call leaves out what the driver reserves for itself, as nvidia-smi does; v1 counts it as
  // used.
  if (NvmlMemoryV2 memory{.version = kNvmlMemoryV2};
      api_->memory_v2 && api_->memory_v2(device, &memory) == kNvmlSuccess) {
    reading.memory_used_bytes = static_cast<double>(memory.used);
    reading.memory_total_bytes = static_cast<double>(memory.total);
  } else if (NvmlMemory memory_v1{}; api_->memory(device, &memory_v1) == kNvmlSuccess) {
    reading.memory_used_bytes = static_cast<double>(memory_v1.used);
    reading.memory_total_bytes = static_cast<double>(memory_v1.total);
  }
  if (unsigned milliwatts = 0; api_->power_milliwatts(device, &milliwatts) == kNvmlSuccess)
    reading.power_watts = milliwatts / 1000.0;
  if (unsigned celsius = 0;
      api_->temperature_celsius(device, kTemperatureGpu, &celsius) == kNvmlSuccess)
    reading.temperature_celsius = celsius;
  if (unsigned megahertz = 0; api_->clock_megahertz(device, kClockSm, &megahertz) == kNvmlSuccess)
    reading.sm_clock_hertz = megahertz * 1e6;
  if (unsigned megahertz = 0;
      api_->clock_megahertz(device, kClockMemory, &megahertz) == kNvmlSuccess)
    reading.memory_clock_hertz = megahertz * 1e6;
  return reading;
}

std::optional<unsigned> NvmlLibrary::device_count(std::string& why_not) const {
  unsigned count = 0;
  if (const NvmlReturn status = api_->count(&count); status != kNvmlSuccess) {
    why_not = fmt::format("nvmlDeviceGetCount_v2: {}", api_->error_string(status));
    return std::nullopt;
  }
  return count;
}

std::string NvmlLibrary::device_name(unsigned device_index) const {
  NvmlDevice device = nullptr;
  char name[kNvmlDeviceNameSize] = {};
  if (api_->handle_by_index(device_index, &device) != kNvmlSuccess ||
      api_->name(device, name, sizeof(name)) != kNvmlSuccess)
    return "";
  return std::string(name, strnlen(name, sizeof(name)));
}

std::optional<std::vector<GpuProcessReading>> NvmlLibrary::compute_processes(
    unsigned device_index, std::string& why_not) const {
  NvmlDevice device = nullptr;
  NvmlReturn status = api_->handle_by_index(device_index, &device);
  std::vector<GpuProcessReading> processes;
  if (status == kNvmlSuccess) {
    if (api_->processes_v3)
      status = list_processes(api_->processes_v3, device, processes);
    else if (api_->processes_v2)
      status = list_processes(api_->processes_v2, device, processes);
    else if (api_->processes_v1)
      status = list_processes(api_->processes_v1, device, processes);
    else {
      why_not = "libnvidia-ml.so.1 has no nvmlDeviceGetComputeRunningProcesses";
      return std::nullopt;
    }
  }
  if (status != kNvmlSuccess) {
    why_not = fmt::format("NVML lists no processes: {}", api_->error_string(status));
    return std::nullopt;
  }
  return processes;
}

}  // namespace kiln
