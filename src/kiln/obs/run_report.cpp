#include "kiln/obs/run_report.h"

#include <fmt/format.h>

#include <optional>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/obs/run_report_charts.h"
#include "kiln/obs/run_report_measured.h"
#include "kiln/obs/run_report_prediction.h"
#include "kiln/obs/run_report_tables.h"
#include "kiln/obs/svg_markup.h"
#include "kiln/obs/tensorboard_observer.h"

namespace kiln {
namespace {

constexpr const char* kStyle = R"(
body { font-family: sans-serif; color: #222; margin: 24px; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.charts p.missing { flex-basis: 100%; margin: 0; }
.missing { color: #555; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; }
th, td { text-align: left; padding: 3px 12px 3px 0; border-bottom: 1px solid #eee; vertical-align: top; }
table.config th { font-weight: normal; font-family: monospace; }
table.config td { font-family: monospace; }
)";

// The run's estimate record, when its files hold one.
std::optional<RunPrediction> prediction_of(const RunHistory& history) {
  const std::string* json = history.text(kEstimateTextTag);
  if (!json) return std::nullopt;
  return prediction_from_json(
      *json, fmt::format("the '{}' text of the event files in '{}'", kEstimateTextTag, history.folder));
}

}  // namespace

std::string render_run_report(const RunHistory& history) {
  const std::optional<RunPrediction> prediction = prediction_of(history);
  const RunPrediction* predicted = prediction ? &*prediction : nullptr;
  const RunMeasured measured = measure_run(history, prediction ? prediction->tokens_per_iteration : 0);
  const std::string folder = escape_markup(history.folder);
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n";
  html += fmt::format("<title>kiln report: {}</title>\n<style>{}</style>\n</head>\n<body>\n", folder, kStyle);
  html += fmt::format("<h1>kiln report: {}</h1>\n", folder);
  html += run_summary_table(history, measured, predicted);
  html += "<h2>Curves</h2>\n<div class=\"charts\">\n" + render_run_charts(history, prediction) + "</div>\n";
  html += "<h2>Predicted and measured</h2>\n" + prediction_table(measured, predicted);
  html += "<h2>Config</h2>\n" + config_table(history.text(kConfigTextTag));
  return html + "</body>\n</html>\n";
}

void write_run_report(const std::string& run_folder, const std::string& output) {
  const std::string page = render_run_report(read_run_history(run_folder));
  try {
    write_file_atomically(output, page);
  } catch (const Error& error) {
    fail("cannot write the report '{}': {}", output, error.what());
  }
}

}  // namespace kiln
