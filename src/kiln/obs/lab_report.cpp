#include "kiln/obs/lab_report.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/obs/svg_bar_chart.h"
#include "kiln/obs/svg_markup.h"

namespace kiln {
namespace {

constexpr int kChartWidth = 900;

constexpr const char* kStyle = R"(
body { font-family: sans-serif; color: #222; margin: 24px; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
p.question { margin: 6px 0 10px; }
.missing { color: #555; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; margin-top: 8px; }
th, td { text-align: left; padding: 3px 12px 3px 0; border-bottom: 1px solid #eee; vertical-align: top; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
td.settings { font-family: monospace; }
)";

// 12345.6 -> "12,346"; below 100, three significant digits: "42.5", "0.731".
std::string samples_text(double samples_per_second) {
  if (!(std::abs(samples_per_second) >= 100)) return fmt::format("{:.3g}", samples_per_second);
  std::string digits = fmt::format("{:.0f}", std::abs(samples_per_second));
  for (int64_t at = static_cast<int64_t>(digits.size()) - 3; at > 0; at -= 3)
    digits.insert(static_cast<size_t>(at), ",");
  return samples_per_second < 0 ? "-" + digits : digits;
}

std::string ratio_text(double ratio) { return fmt::format("{:.2f}\u00d7", ratio); }

// "key=value, key=value", the ranks last where there are several; the base configuration itself
// where the row sets nothing.
std::string settings_text(const LabRowResult& row) {
  std::string text;
  for (const auto& [key, value] : row.settings) text += (text.empty() ? "" : ", ") + key + "=" + value;
  if (row.ranks > 1) text += (text.empty() ? "" : ", ") + fmt::format("ranks={}", row.ranks);
  return text.empty() ? "base configuration" : text;
}

std::string not_run_text(const std::string& reason) {
  return "not run: " + (reason.empty() ? std::string("no reason given") : reason);
}

std::string samples_chart(const LabExperiment& lab) {
  BarChart chart;
  chart.title = fmt::format("Lab {}: samples/s", lab.number);
  chart.value_label = "samples/s (higher is better)";
  for (const LabRowResult& row : lab.rows) {
    BarRow bar{row.name, std::nullopt, "", "", row.baseline};
    if (row.measured) {
      bar.value = row.measured->samples_per_second;
      bar.value_text =
          fmt::format("{} ({})", samples_text(row.measured->samples_per_second), ratio_text(row.measured->ratio));
    } else {
      bar.note = not_run_text(row.unavailable);
    }
    chart.rows.push_back(std::move(bar));
  }
  return render_bar_chart(chart, kChartWidth);
}

std::string cell(const std::string& text, const char* css_class = nullptr) {
  return fmt::format("<td{}>{}</td>", css_class ? fmt::format(" class=\"{}\"", css_class) : "", escape_markup(text));
}

std::string rows_table(const LabExperiment& lab) {
  std::string html =
      "<table class=\"lab\">\n<tr><th>row</th><th>settings</th><th>samples/s</th><th>step (ms)</th>"
      "<th>peak memory (MiB)</th><th>data wait (%)</th><th>vs baseline</th></tr>\n";
  for (const LabRowResult& row : lab.rows) {
    html += "<tr><th>" + escape_markup(row.name) + (row.baseline ? " (baseline)" : "") + "</th>";
    html += cell(settings_text(row), "settings");
    if (const auto& m = row.measured) {
      html += cell(samples_text(m->samples_per_second), "number");
      html += cell(fmt::format("{:.2f}", m->step_ms), "number");
      html += cell(fmt::format("{:.1f}", static_cast<double>(m->peak_memory_bytes) / 0x1p20), "number");
      html += cell(fmt::format("{:.1f}", m->data_wait_share * 100), "number");
      html += cell(ratio_text(m->ratio), "number");
    } else {
      html += "<td class=\"missing\" colspan=\"5\">" + escape_markup(not_run_text(row.unavailable)) + "</td>";
    }
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

std::string lab_section(const LabExperiment& lab) {
  std::string html = fmt::format("<h2>Lab {}: {}</h2>\n", lab.number, escape_markup(lab.title));
  if (!lab.question.empty()) html += "<p class=\"question\">" + escape_markup(lab.question) + "</p>\n";
  if (!lab.unavailable.empty())
    return html + "<p class=\"missing\">Not run here: " + escape_markup(lab.unavailable) + "</p>\n";
  if (lab.rows.empty()) return html + "<p class=\"missing\">No rows.</p>\n";
  return html + samples_chart(lab) + "\n" + rows_table(lab);
}

std::string summary_row(const char* name, const std::string& value) {
  return fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", name, escape_markup(value));
}

}  // namespace

std::string render_lab_report(const LabResults& results) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n";
  html += fmt::format("<title>kiln lab</title>\n<style>{}</style>\n</head>\n<body>\n", kStyle);
  html += "<h1>kiln lab</h1>\n<table class=\"summary\">\n";
  html += summary_row("model", results.model);
  html += summary_row("machine", results.machine);
  html += summary_row("iterations", fmt::format("{} warm-up, {} timed (step time: their median)", results.warmup_iters,
                                                results.timed_iters));
  html += "</table>\n";
  for (const LabExperiment& lab : results.labs) html += lab_section(lab);
  return html + "</body>\n</html>\n";
}

void write_lab_report(const LabResults& results, const std::string& output) {
  const std::string page = render_lab_report(results);
  try {
    write_file_atomically(output, page);
  } catch (const Error& error) {
    fail("cannot write the lab report '{}': {}", output, error.what());
  }
}

}  // namespace kiln
