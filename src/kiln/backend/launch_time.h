// One piece of device work inside an op (a kernel, a library's product or attention) as a back-end
// timed it on the device for --profile-ops (Backend::take_launch_times, op_timing.h).
#pragma once

#include <string>

namespace kiln {

inline constexpr const char* kComputeStream = "compute stream";  // the stream the ops run on

struct LaunchTime {
  std::string what;  // the kernel's name, or the library call's label ("cuBLASLt product")
  double ms = 0.0;   // from just before it started to just after it ended, on the device
  double start_ms = 0.0;  // from when launch timing was turned on to just before it started
  std::string stream = kComputeStream;  // the device queue it ran on; also "copy stream", "communication stream"
};

}  // namespace kiln
