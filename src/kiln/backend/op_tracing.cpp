#include "kiln/backend/op_tracing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "kiln/core/trace.h"

namespace kiln {

TracingBackend::~TracingBackend() { stop_device_timing(); }

void TracingBackend::start_device_timing() {
  stop_device_timing();
  inner().synchronize();
  inner().set_launch_timing(true);
  device_epoch_ns_ = trace::now_ns();
  device_timing_ = true;
  bytes_recorded_ = false;
}

void TracingBackend::stop_device_timing() {
  if (device_timing_) inner().set_launch_timing(false);
  device_timing_ = false;
}

void TracingBackend::around(const std::function<OpWork()>& work, const std::function<void()>& run) {
  if (!trace::recording()) {
    run();
    return;
  }
  const int64_t start = trace::now_ns();
  run();
  trace::complete("op", work().op, start, trace::now_ns() - start);
  const size_t bytes = inner().allocated_bytes();
  if (!bytes_recorded_ || bytes != recorded_bytes_) {
    trace::counter("memory allocated (bytes)", static_cast<double>(bytes));
    recorded_bytes_ = bytes;
    bytes_recorded_ = true;
  }
}

void TracingBackend::record_device_work() {
  if (!device_timing_ || !trace::recording()) return;
  // Start and duration come rounded apart, so a piece may seem to start before the previous one
  // on its stream ended: it is moved to that end, as a stream runs its work one after another.
  std::map<std::string, int64_t> stream_end_ns;
  for (const LaunchTime& launch : inner().take_launch_times()) {
    int64_t& previous_end = stream_end_ns[launch.stream];
    const int64_t start = std::max<int64_t>(device_epoch_ns_ + std::llround(launch.start_ms * 1e6), previous_end);
    const int64_t duration = std::llround(launch.ms * 1e6);
    trace::complete_on_track(launch.stream, "device", launch.what, start, duration);
    previous_end = start + duration;
  }
  // A fresh start for the next step's times: cudaEventElapsedTime's float milliseconds lose
  // precision as they grow.
  start_device_timing();
}

}  // namespace kiln
