#include "kiln/backend/op_timing.h"

#include <fmt/format.h>

#include <chrono>

namespace kiln {

OpTimingBackend::OpTimingBackend(std::unique_ptr<Backend> inner) : OpDecorator(std::move(inner)) {
  this->inner().set_launch_timing(true);
}

OpTimingBackend::~OpTimingBackend() { inner().set_launch_timing(false); }

void OpTimingBackend::around(const std::function<OpWork()>& work, const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  inner().synchronize();
  std::vector<LaunchTime> launches = inner().take_launch_times();
  // Copies and collectives on streams of their own belong to no op (launch_time.h).
  std::erase_if(launches, [](const LaunchTime& launch) { return launch.stream != kComputeStream; });
  ledger_.add(work(), std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
              launches);
}

std::string OpTimingBackend::format(const std::vector<OpTotals>& times,
                                    const DeviceLimits* limits) {
  double total = 0.0;
  for (const OpTotals& time : times) total += time.total_ms;
  std::string table = fmt::format(
      "{:<52} {:>7} {:>11} {:>11} {:>7} {:>16}{}\n", "op (each followed by a device wait)", "calls",
      "total ms", "ms/call", "share", "rate", limits ? fmt::format(" {:>12}", "of roofline") : "");
  for (const OpTotals& time : times) {
    const double seconds = time.total_ms * 1e-3;
    const std::string rate =
        seconds <= 0.0     ? ""
        : time.flops > 0.0 ? fmt::format("{:.2f} TFLOP/s", time.flops / seconds * 1e-12)
        : time.bytes > 0.0 ? fmt::format("{:.1f} GB/s", time.bytes / seconds * 1e-9)
                           : "";
    const bool has_roofline = limits && seconds > 0.0 && !time.host_copy;
    const std::string roofline =
        has_roofline
            ? fmt::format(" {:>11.1f}%", 100.0 * roofline_ms(time, *limits) / time.total_ms)
            : "";
    table += fmt::format("{:<52} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}% {:>16}{}\n", time.op,
                         time.calls, time.total_ms, time.total_ms / static_cast<double>(time.calls),
                         total > 0 ? 100.0 * time.total_ms / total : 0.0, rate, roofline);
    // The device work inside the op: per op call, and its share of the op's (wall) time.
    for (const LaunchTotals& launch : time.launches)
      table += fmt::format("  {:<50} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}% of the op\n", launch.what,
                           launch.launches, launch.total_ms,
                           launch.total_ms / static_cast<double>(time.calls),
                           time.total_ms > 0 ? 100.0 * launch.total_ms / time.total_ms : 0.0);
  }
  table += fmt::format("{:<52} {:>7} {:>11.3f}\n", "all ops", "", total);
  return table;
}

}  // namespace kiln
