#include "kiln/obs/run_report_charts.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "kiln/obs/svg_chart.h"
#include "kiln/obs/svg_markup.h"

namespace kiln {
namespace {

constexpr int kChartWidth = 660, kChartHeight = 300;

// `tag`'s points as a series, each value divided by `unit`.
ChartSeries series_of(const RunHistory& history, std::string_view tag, std::string label, std::string_view colour,
                      double unit = 1) {
  ChartSeries series{std::move(label), std::string(colour), {}};
  for (const ScalarPoint& point : history.scalar(tag))
    series.points.push_back({static_cast<double>(point.step), point.value / unit});
  return series;
}

std::string missing(std::string_view what, std::string_view why) {
  return fmt::format("<p class=\"missing\">{}: {}.</p>\n", escape_markup(what), escape_markup(why));
}

std::string chart(LineChart line_chart) { return render_line_chart(line_chart, kChartWidth, kChartHeight) + "\n"; }

std::string loss_chart(const RunHistory& history) {
  if (history.scalar("lm loss").empty()) return missing("Loss", "no 'lm loss' in the event files");
  LineChart loss{"Loss", "iteration", "cross-entropy", {}};
  loss.series.push_back(series_of(history, "lm loss", "training", kReportColours.training_loss));
  std::string note;
  if (history.scalar("lm loss validation").empty()) {
    note = missing("Validation loss",
                   "none in the event files; kiln train validates every --eval-interval iterations with "
                   "--eval-iters above 0");
  } else {
    ChartSeries validation = series_of(history, "lm loss validation", "validation", kReportColours.validation_loss);
    validation.dots = true;
    loss.series.push_back(std::move(validation));
  }
  return chart(std::move(loss)) + note;
}

std::string single_tag_chart(const RunHistory& history, std::string_view tag, const std::string& title,
                             const std::string& y_label, std::string_view colour, bool from_zero) {
  if (history.scalar(tag).empty()) return missing(title, fmt::format("no '{}' in the event files", tag));
  LineChart single{title, "iteration", y_label, {series_of(history, tag, y_label, colour)}, from_zero};
  return chart(std::move(single));
}

std::string timer_charts(const RunHistory& history) {
  if (history.scalar("iteration-time").empty() && history.scalar("throughput").empty())
    return missing("Throughput and time per iteration",
                   "not in the event files; kiln train --log-timers-to-tensorboard writes them");
  std::string html =
      single_tag_chart(history, "throughput", "Throughput", "TFLOP/s per GPU", kReportColours.throughput, true);
  LineChart times{"Time per iteration", "iteration", "seconds", {}, true};
  times.series.push_back(series_of(history, "iteration-time", "iteration", kReportColours.iteration_time));
  times.series.push_back(series_of(history, "batch-generator-time", "waiting for data", kReportColours.data_wait));
  times.series.push_back(
      series_of(history, "all-grads-sync-time", "waiting for gradient sync", kReportColours.grad_sync_wait));
  return html + chart(std::move(times));
}

bool same_values(const std::vector<ScalarPoint>& a, const std::vector<ScalarPoint>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const ScalarPoint& x, const ScalarPoint& y) { return x.step == y.step && x.value == y.value; });
}

std::string memory_chart(const RunHistory& history, const std::optional<RunPrediction>& prediction) {
  const std::vector<ScalarPoint>& peak = history.scalar("mem-max-allocated-bytes");
  const std::vector<ScalarPoint>& device = history.scalar("mem-reserved-bytes");
  if (peak.empty())
    return missing("Memory", "not in the event files; kiln train --log-memory-to-tensorboard writes it");
  const double predicted = prediction ? prediction->memory_bytes_per_gpu : 0;
  double largest = predicted;
  for (const auto* points : {&peak, &device})
    for (const ScalarPoint& point : *points) largest = std::max(largest, point.value);
  const double unit = largest >= 0x1p30 ? 0x1p30 : largest >= 0x1p20 ? 0x1p20 : 0x1p10;
  const char* unit_name = unit == 0x1p30 ? "GiB" : unit == 0x1p20 ? "MiB" : "KiB";

  LineChart memory{"Memory per GPU", "iteration", unit_name, {}, true};
  memory.series.push_back(
      series_of(history, "mem-max-allocated-bytes", "kiln's buffers, peak", kReportColours.memory, unit));
  std::string note;
  if (same_values(peak, device)) {
    note = missing("Device memory",
                   "'mem-reserved-bytes' equals kiln's buffers at every step (a CPU run: no driver counts its memory)");
  } else if (!device.empty()) {
    memory.series.push_back(
        series_of(history, "mem-reserved-bytes", "device in use", kReportColours.device_memory, unit));
  }
  if (predicted > 0) {
    ChartSeries estimate{"kiln estimate",
                         std::string(kReportColours.predicted_memory),
                         {{static_cast<double>(peak.front().step), predicted / unit},
                          {static_cast<double>(peak.back().step), predicted / unit}}};
    estimate.dashed = true;
    memory.series.push_back(std::move(estimate));
  }
  return chart(std::move(memory)) + note;
}

}  // namespace

std::string render_run_charts(const RunHistory& history, const std::optional<RunPrediction>& prediction) {
  return loss_chart(history) +
         single_tag_chart(history, "learning-rate", "Learning rate", "learning rate", kReportColours.learning_rate,
                          true) +
         single_tag_chart(history, "grad-norm", "Gradient norm", "norm before clipping", kReportColours.grad_norm,
                          false) +
         timer_charts(history) + memory_chart(history, prediction);
}

}  // namespace kiln
