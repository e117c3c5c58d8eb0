// The GPU half of `kiln top`: every GPU NVML sees, read now, with the processes that have a
// compute context on it and their names. Plain values, so a frame can also be given by hand.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/obs/nvml_library.h"

namespace kiln {

struct TopProcess {
  unsigned pid = 0;
  std::string name;  // its /proc/PID/comm; "" where this machine's /proc has no such process
  std::optional<double> used_memory_bytes;
};

struct TopGpu {
  unsigned index = 0;  // NVML's, as nvidia-smi numbers the GPUs
  std::string name;    // "" where NVML does not give it
  GpuReading reading;
  std::vector<TopProcess> processes;
  std::string processes_unknown;  // why NVML listed no processes; empty when it listed them
};

struct TopGpus {
  std::vector<TopGpu> gpus;
  std::string none_because;  // why there are none (NVML did not load, sees no GPU); "" otherwise
};

TopGpus read_top_gpus(const NvmlLibrary& nvml);

// The name the kernel keeps for a process (/proc/PID/comm, at most 15 characters); "" when there
// is no such process here.
std::string process_name(unsigned pid);

}  // namespace kiln
