#include "kiln/obs/run_report_tables.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <vector>

#include "kiln/obs/svg_markup.h"

namespace kiln {
namespace {

constexpr const char* kTimersFlag = "not measured: kiln train --log-timers-to-tensorboard measures it";
constexpr const char* kMemoryFlag = "not measured: kiln train --log-memory-to-tensorboard measures it";

// 124439808 -> "124,439,808".
std::string with_commas(int64_t number) {
  std::string digits = std::to_string(number < 0 ? -number : number);
  for (int64_t at = static_cast<int64_t>(digits.size()) - 3; at > 0; at -= 3)
    digits.insert(static_cast<size_t>(at), ",");
  return number < 0 ? "-" + digits : digits;
}

std::string bytes_text(double bytes) {
  if (bytes >= 0x1p30) return fmt::format("{:.2f} GiB", bytes / 0x1p30);
  if (bytes >= 0x1p20) return fmt::format("{:.2f} MiB", bytes / 0x1p20);
  return fmt::format("{:.1f} KiB", bytes / 0x1p10);
}

std::string seconds_text(double seconds) {
  return seconds < 1 ? fmt::format("{:.3g} ms", seconds * 1e3) : fmt::format("{:.3g} s", seconds);
}

std::string flops_text(double flops) {
  constexpr std::pair<double, const char*> kScales[] = {
      {1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}};
  for (const auto& [scale, name] : kScales)
    if (flops >= scale) return fmt::format("{:.3g} {}", flops / scale, name);
  return fmt::format("{:.3g} FLOP", flops);
}

std::string wall_text(double seconds) {
  const auto whole = static_cast<int64_t>(std::llround(seconds));
  if (whole < 60) return fmt::format("{:.1f} s", seconds);
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole % 3600 / 60);
}

std::string row(const std::vector<std::string>& cells) {
  std::string html = "<tr><th>" + escape_markup(cells.front()) + "</th>";
  for (size_t i = 1; i < cells.size(); ++i) html += "<td>" + escape_markup(cells[i]) + "</td>";
  return html + "</tr>\n";
}

std::string ratio_text(const std::optional<double>& measured, const std::optional<double>& predicted) {
  if (!measured || !predicted || *predicted <= 0) return "";
  return fmt::format("{:.2f}\u00d7", *measured / *predicted);
}

// A prediction row: the predicted and measured texts, and their ratio where both are numbers.
struct Compared {
  std::string quantity;
  std::optional<double> predicted;
  std::string predicted_text;  // also why there is no prediction
  std::optional<double> measured;
  std::string measured_text;  // also why there is no measurement
};

std::string compared_row(const Compared& c) {
  return row({c.quantity, c.predicted_text, c.measured_text, ratio_text(c.measured, c.predicted)});
}

}  // namespace

std::string run_summary_table(const RunHistory& history, const RunMeasured& measured, const RunPrediction* prediction) {
  std::string files;
  for (const std::string& file : history.files)
    files += (files.empty() ? "" : ", ") + std::filesystem::path(file).filename().string();
  std::string html = "<table class=\"summary\">\n";
  html += row({"run folder", history.folder});
  html += row({"event files", fmt::format("{} ({})", history.files.size(), files)});
  html += row({"device", prediction ? prediction->device : "unknown: the event files hold no estimate"});
  html += row({"iterations", measured.last_loss
                                 ? fmt::format("{} to {}", measured.first_loss->step, measured.last_loss->step)
                                 : "none logged"});
  html += row({"samples", measured.samples ? with_commas(*measured.samples) : "none logged"});
  html +=
      row({"last training loss", measured.last_loss ? fmt::format("{:.4f} at iteration {}", measured.last_loss->value,
                                                                  measured.last_loss->step)
                                                    : "none logged"});
  html += row({"last validation loss",
               measured.last_validation_loss
                   ? fmt::format("{:.4f} at iteration {}", measured.last_validation_loss->value,
                                 measured.last_validation_loss->step)
                   : "none: kiln train validates every --eval-interval iterations with --eval-iters above 0"});
  html +=
      row({"time per iteration",
           measured.seconds_per_iteration ? seconds_text(*measured.seconds_per_iteration) + " (mean)" : kTimersFlag});
  html += row({"tokens per second", measured.tokens_per_second
                                        ? with_commas(std::llround(*measured.tokens_per_second)) + " (mean)"
                                    : measured.seconds_per_iteration ? "unknown: the event files hold no estimate"
                                                                     : kTimersFlag});
  html += row({"TFLOP/s per GPU",
               measured.tflops_per_gpu ? fmt::format("{:.3g} (mean)", *measured.tflops_per_gpu) : kTimersFlag});
  html += row({"wall time", wall_text(history.wall_seconds) + " (from the events' time stamps)"});
  return html + "</table>\n";
}

std::string prediction_table(const RunMeasured& measured, const RunPrediction* prediction) {
  std::string html;
  if (!prediction) {
    html +=
        "<p class=\"missing\">The event files hold no estimate: kiln train writes one at the start of a run "
        "(the <code>estimate</code> text), and this run's kiln did not.</p>\n";
  } else if (!prediction->unavailable.empty()) {
    html += "<p class=\"missing\">kiln estimate could not predict this run: " + escape_markup(prediction->unavailable) +
            "</p>\n";
  }
  const RunPrediction* usable = prediction && prediction->unavailable.empty() ? prediction : nullptr;
  const std::string unpredicted = "not predicted";
  const std::string untimed = usable ? unpredicted + ": " + usable->no_time_because : unpredicted;
  const std::string datasheet = usable ? fmt::format(" (the {} datasheet's roofline)", usable->gpu) : "";
  const std::optional<double> memory = usable ? std::optional<double>(usable->memory_bytes_per_gpu) : std::nullopt;
  const std::optional<double> seconds = usable ? usable->seconds_per_iteration : std::nullopt;
  const std::optional<double> tokens = usable ? usable->tokens_per_second : std::nullopt;
  const std::optional<double> tflops =
      seconds ? std::optional<double>(usable->flops_per_iteration / static_cast<double>(usable->data_parallel_size) /
                                      *seconds * 1e-12)
              : std::nullopt;
  const std::vector<Compared> rows = {
      {"parameters", std::nullopt, usable ? with_commas(usable->parameters) : unpredicted, std::nullopt,
       "a count, not measured"},
      {"model FLOPs per iteration", std::nullopt, usable ? flops_text(usable->flops_per_iteration) : unpredicted,
       std::nullopt, "a count, not measured"},
      {"memory per GPU (kiln's buffers)", memory, memory ? bytes_text(*memory) : unpredicted,
       measured.peak_memory_bytes,
       measured.peak_memory_bytes ? bytes_text(*measured.peak_memory_bytes) + " (peak)" : kMemoryFlag},
      {"time per iteration", seconds, seconds ? "at least " + seconds_text(*seconds) + datasheet : untimed,
       measured.seconds_per_iteration,
       measured.seconds_per_iteration ? seconds_text(*measured.seconds_per_iteration) + " (mean)" : kTimersFlag},
      {"tokens per second", tokens, tokens ? "at most " + with_commas(std::llround(*tokens)) + datasheet : untimed,
       measured.tokens_per_second,
       measured.tokens_per_second ? with_commas(std::llround(*measured.tokens_per_second)) + " (mean)" : kTimersFlag},
      {"TFLOP/s per GPU", tflops, tflops ? fmt::format("at most {:.3g}", *tflops) + datasheet : untimed,
       measured.tflops_per_gpu,
       measured.tflops_per_gpu ? fmt::format("{:.3g} (mean)", *measured.tflops_per_gpu) : kTimersFlag}};
  html +=
      "<table class=\"prediction\">\n<tr><th></th><th>kiln estimate</th><th>measured</th><th>measured / "
      "estimate</th></tr>\n";
  for (const Compared& compared : rows) html += compared_row(compared);
  return html + "</table>\n";
}

std::string config_table(const std::string* config_yaml) {
  if (!config_yaml)
    return "<p class=\"missing\">The event files hold no config: kiln train writes it at the start of a run (the "
           "<code>config</code> text), and this run's kiln did not.</p>\n";
  std::string html = "<table class=\"config\">\n";
  std::istringstream lines(*config_yaml);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(": ");
    html += colon == std::string::npos ? row({line, ""}) : row({line.substr(0, colon), line.substr(colon + 2)});
  }
  return html + "</table>\n";
}

}  // namespace kiln
