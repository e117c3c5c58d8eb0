// The curves of `kiln report`, one inline SVG line chart each (svg_chart.h), against the iteration:
//   Loss                 `lm loss`, with `lm loss validation` drawn over it (dots)
//   Learning rate        `learning-rate`
//   Gradient norm        `grad-norm`
//   Throughput           `throughput` (TFLOP/s per GPU)                  --log-timers-to-tensorboard
//   Time per iteration   `iteration-time`, `batch-generator-time`,
//                        `all-grads-sync-time`                             --log-timers-to-tensorboard
//   Memory               `mem-max-allocated-bytes`, `mem-reserved-bytes`
//                        (one line where they agree, as on the CPU), and
//                        the estimate's memory per GPU, dashed            --log-memory-to-tensorboard
// A chart whose tags the run did not write is left out, and a line in its place names the flag
// of `kiln train` that writes them. Each series has a colour of its own that nothing else on the
// page uses (kReportColours), so a screenshot shows which lines were drawn. Pure, thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kiln/obs/run_report_history.h"
#include "kiln/obs/run_report_prediction.h"

namespace kiln {

struct ReportColours {
  std::string_view training_loss = "#1f77b4", validation_loss = "#d62728", learning_rate = "#2ca02c",
                   grad_norm = "#17becf", throughput = "#9467bd", iteration_time = "#8c564b", data_wait = "#e377c2",
                   grad_sync_wait = "#bcbd22", memory = "#ff7f0e", device_memory = "#7b4173",
                   predicted_memory = "#637939";
};
inline constexpr ReportColours kReportColours{};

// The charts as HTML: <svg> elements and <p class="missing"> lines. `prediction`: the run's estimate
// record, when it has one.
std::string render_run_charts(const RunHistory& history, const std::optional<RunPrediction>& prediction);

}  // namespace kiln
