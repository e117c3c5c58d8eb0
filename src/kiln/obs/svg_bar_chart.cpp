#include "kiln/obs/svg_bar_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kiln/obs/svg_chart.h"
#include "kiln/obs/svg_chart_parts.h"
#include "kiln/obs/svg_markup.h"

namespace kiln {
namespace {

// Vertical layout: the title above the first row, the tick labels and the value label below the
// last. A bar is kBarHeight high in a row kRowPitch high.
constexpr double kTop = 30, kRowPitch = 26, kBarHeight = 16, kAxisRoom = 44;
// Horizontal: about 6.5 px a character at 12 px; the label column takes at most this share of the
// width (a longer label runs off the left edge rather than squeezing the bars to nothing).
constexpr double kCharWidth = 6.5, kMaxLabelShare = 0.4, kMinPlotWidth = 40;
constexpr int kMaxTicks = 6;

bool has_bar(const BarRow& row) { return row.value && std::isfinite(*row.value); }

std::string value_text(const BarRow& row) {
  return row.value_text.empty() ? fmt::format("{:g}", *row.value) : row.value_text;
}

double text_width(const std::string& text) { return kCharWidth * static_cast<double>(text.size()); }

// The value axis: zero and every bar's value, widened to (0, 1) where that is a single value.
ChartAxis value_axis(const BarChart& chart) {
  double min = 0, max = 0;
  for (const BarRow& row : chart.rows)
    if (has_bar(row)) {
      min = std::min(min, *row.value);
      max = std::max(max, *row.value);
    }
  if (min == max) max = 1;
  return round_axis(min, max, kMaxTicks, false);
}

// The plot's pixels: right of the longest label, left of room for the longest value text.
ChartScale value_scale(const BarChart& chart, const ChartAxis& axis, int width) {
  double label_room = 0, value_room = 0;
  for (const BarRow& row : chart.rows) {
    label_room = std::max(label_room, text_width(row.label));
    if (has_bar(row)) value_room = std::max(value_room, text_width(value_text(row)));
  }
  const double from = std::min(std::max(label_room + 16, 60.0), std::max(kMaxLabelShare * width, 60.0));
  const double to = std::max(width - std::max(value_room + 12, 24.0), from + kMinPlotWidth);
  return {axis.lo, axis.hi, from, to};
}

void draw_legend(std::string& svg, const BarChart& chart, int width) {
  if (std::none_of(chart.rows.begin(), chart.rows.end(), [](const BarRow& row) { return row.baseline; })) return;
  const double at = width - 16 - text_width("baseline") - 16;
  svg += fmt::format(R"(<line x1="{0:.1f}" y1="13" x2="{1:.1f}" y2="13" stroke="{2}" stroke-width="10"/>)", at, at + 12,
                     escape_markup(chart.baseline_colour));
  svg += fmt::format(R"(<text x="{:.1f}" y="17">baseline</text>)", at + 16);
}

void draw_axis(std::string& svg, const BarChart& chart, const ChartAxis& axis, const ChartScale& x, double axis_y) {
  for (const double tick : axis.ticks) {
    svg += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#e4e4e4"/>)", x(tick), kTop,
                       axis_y);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", x(tick), axis_y + 16,
                       chart_tick_label(tick, axis.step));
  }
  svg += fmt::format(R"(<path d="M{:.1f} {:.1f} V{:.1f} M{:.1f} {:.1f} H{:.1f}" fill="none" stroke="#aaa"/>)", x(0),
                     kTop, axis_y, x.from, axis_y, x.to);
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", (x.from + x.to) / 2, axis_y + 34,
                     escape_markup(chart.value_label));
}

void draw_row(std::string& svg, const BarChart& chart, const BarRow& row, const ChartScale& x, double top) {
  const double text_y = top + kRowPitch / 2 + 4;
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)", x.from - 8, text_y,
                     escape_markup(row.label));
  if (!has_bar(row)) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-style="italic" fill="#666">{}</text>)", x(0) + 4, text_y,
                       escape_markup(row.note.empty() ? "no value" : row.note));
    return;
  }
  const double value = *row.value, left = x(std::min(value, 0.0)), right = x(std::max(value, 0.0));
  svg += fmt::format(R"(<rect class="bar" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.0f}" fill="{}"/>)", left,
                     top + (kRowPitch - kBarHeight) / 2, right - left, kBarHeight,
                     escape_markup(row.baseline ? chart.baseline_colour : chart.colour));
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="{}">{}</text>)", value < 0 ? left - 4 : right + 4,
                     text_y, value < 0 ? "end" : "start", escape_markup(value_text(row)));
}

}  // namespace

int bar_chart_height(size_t rows) {
  return static_cast<int>(kTop + static_cast<double>(std::max<size_t>(rows, 1)) * kRowPitch + kAxisRoom);
}

std::string render_bar_chart(const BarChart& chart, int width) {
  const int height = bar_chart_height(chart.rows.size());
  const ChartAxis axis = value_axis(chart);
  const ChartScale x = value_scale(chart, axis, width);
  const double axis_y = height - kAxisRoom;

  std::string svg = chart_svg_start(chart.title, width, height, 8);
  draw_legend(svg, chart, width);
  draw_axis(svg, chart, axis, x, axis_y);
  if (chart.rows.empty())
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-style="italic" fill="#666">no rows</text>)", x.from + 4,
                       kTop + kRowPitch / 2 + 4);
  for (size_t i = 0; i < chart.rows.size(); ++i)
    draw_row(svg, chart, chart.rows[i], x, kTop + static_cast<double>(i) * kRowPitch);
  return svg + "</svg>";
}

}  // namespace kiln
