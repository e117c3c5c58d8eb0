#include "kiln/obs/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/error.h"
#include "kiln/obs/svg_chart_parts.h"
#include "kiln/obs/svg_markup.h"

namespace kiln {
namespace {

// The plot area's margins: room for the title and legend above, the tick labels and axis labels
// left and below.
constexpr double kTop = 50, kRight = 16, kBottom = 42, kLeft = 68;
constexpr int kMaxYTicks = 6, kMaxXTicks = 8;
constexpr const char* kDashes = R"( stroke-dasharray="6 4")";

// The smallest of 1, 2, 5 x 10^k that is at least `raw` (> 0).
double round_step(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / power;
  return power * (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10);
}

struct Span {
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  bool empty() const { return min > max; }
  void add(double value) {
    min = std::min(min, value);
    max = std::max(max, value);
  }
  // Widened where it holds one value (or none), so an axis can be drawn over it.
  Span shown(bool whole_numbers) const {
    if (empty()) return {0, 1};
    if (min < max) return *this;
    const double pad = whole_numbers ? 1 : min == 0 ? 1 : std::abs(min) * 0.05;
    return {min - pad, max + pad};
  }
};

// The series' path: "M x y L x y ...", a new "M" after each non-finite y.
std::string path_of(const ChartSeries& series, const ChartScale& x, const ChartScale& y) {
  std::string d;
  bool pen_down = false;
  for (const ChartPoint& point : series.points) {
    if (!std::isfinite(point.x) || !std::isfinite(point.y)) {
      pen_down = false;
      continue;
    }
    d += fmt::format("{}{:.1f} {:.1f} ", pen_down ? "L" : "M", x(point.x), y(point.y));
    pen_down = true;
  }
  return d;
}

void draw_legend(std::string& svg, const LineChart& chart) {
  double at = kLeft;
  for (const ChartSeries& series : chart.series) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="35" x2="{:.1f}" y2="35" stroke="{}" stroke-width="2"{}/>)", at, at + 18,
                       escape_markup(series.colour), series.dashed ? kDashes : "");
    svg += fmt::format(R"(<text x="{:.1f}" y="39">{}</text>)", at + 23, escape_markup(series.label));
    at += 23 + 6.5 * static_cast<double>(series.label.size()) + 18;  // about 6.5 px a character at 12 px
  }
}

void draw_axes(std::string& svg, const LineChart& chart, const ChartAxis& x_axis, const ChartAxis& y_axis,
               const ChartScale& x, const ChartScale& y) {
  for (const double tick : y_axis.ticks) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e4e4e4"/>)", x.from, y(tick),
                       x.to, y(tick));
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)", x.from - 6, y(tick) + 4,
                       chart_tick_label(tick, y_axis.step));
  }
  for (const double tick : x_axis.ticks) {
    svg += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#aaa"/>)", x(tick), y.from,
                       y.from + 5);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", x(tick), y.from + 18,
                       chart_tick_label(tick, x_axis.step));
  }
  svg += fmt::format(R"(<path d="M{:.1f} {:.1f} V{:.1f} H{:.1f}" fill="none" stroke="#aaa"/>)", x.from, y.to, y.from,
                     x.to);
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", (x.from + x.to) / 2, y.from + 36,
                     escape_markup(chart.x_label));
  svg += fmt::format(R"svg(<text transform="translate(14 {:.1f}) rotate(-90)" text-anchor="middle">{}</text>)svg",
                     (y.from + y.to) / 2, escape_markup(chart.y_label));
}

}  // namespace

ChartAxis round_axis(double min, double max, int max_ticks, bool whole_numbers) {
  KILN_CHECK(std::isfinite(min) && std::isfinite(max) && min < max && max_ticks >= 1,
             "an axis needs finite min < max and a tick, got [{}, {}] and {}", min, max, max_ticks);
  ChartAxis axis;
  axis.step = round_step((max - min) / max_ticks);
  if (whole_numbers) axis.step = std::max(axis.step, 1.0);
  const double first = std::floor(min / axis.step), last = std::ceil(max / axis.step);
  axis.lo = first * axis.step;
  axis.hi = last * axis.step;
  for (double index = first; index <= last; ++index) axis.ticks.push_back(index * axis.step);
  return axis;
}

std::string render_line_chart(const LineChart& chart, int width, int height) {
  Span xs, ys;
  if (chart.y_from_zero) ys.add(0);
  for (const ChartSeries& series : chart.series)
    for (const ChartPoint& point : series.points)
      if (std::isfinite(point.x) && std::isfinite(point.y)) {
        xs.add(point.x);
        ys.add(point.y);
      }
  const Span x_span = xs.shown(chart.x_whole_numbers), y_span = ys.shown(false);
  const ChartAxis x_axis = round_axis(x_span.min, x_span.max, kMaxXTicks, chart.x_whole_numbers);
  const ChartAxis y_axis = round_axis(y_span.min, y_span.max, kMaxYTicks, false);
  const ChartScale x{x_axis.lo, x_axis.hi, kLeft, width - kRight};
  const ChartScale y{y_axis.lo, y_axis.hi, height - kBottom, kTop};  // up the page

  std::string svg = chart_svg_start(chart.title, width, height, kLeft);
  draw_legend(svg, chart);
  draw_axes(svg, chart, x_axis, y_axis, x, y);
  if (xs.empty())
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">no finite values</text>)",
                       (x.from + x.to) / 2, (y.from + y.to) / 2);
  for (const ChartSeries& series : chart.series) {
    const std::string colour = escape_markup(series.colour);
    svg += fmt::format(R"(<path d="{}" fill="none" stroke="{}" stroke-width="2" stroke-linejoin="round"{}/>)",
                       path_of(series, x, y), colour, series.dashed ? kDashes : "");
    if (!series.dots && series.points.size() > 1) continue;
    for (const ChartPoint& point : series.points)
      if (std::isfinite(point.x) && std::isfinite(point.y))
        svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", x(point.x), y(point.y), colour);
  }
  return svg + "</svg>";
}

}  // namespace kiln
