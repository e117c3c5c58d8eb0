// A line chart as one inline <svg> element, for `kiln report`'s page: a title, a legend, axes with
// ticks at round numbers and labels, and each series as a line (a dot at each point where asked, or
// where a series has one point). No script, no external resource, no fonts but the generic
// sans-serif: any browser draws it offline.
//
// The axes span the finite points of every series (from zero on the y axis where asked); a span of
// one value is widened so that it shows. A non-finite y (a loss gone NaN) breaks its line there. The
// series are drawn in order, later over earlier. All text is escaped (svg_markup.h). Pure functions,
// thread-safe.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct ChartPoint {
  double x = 0, y = 0;
};

struct ChartSeries {
  std::string label;
  std::string colour;  // a CSS colour, "#1f77b4"; the line, the dots and the legend's swatch
  std::vector<ChartPoint> points;
  bool dots = false;    // a dot at every point (a sparse series, such as validation)
  bool dashed = false;  // a dashed line (a prediction, not a measurement)
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;
  bool y_from_zero = false;     // the y axis starts at 0 (or below, for negative values)
  bool x_whole_numbers = true;  // ticks on the x axis at whole numbers only (iterations)
};

// Ticks at the multiples of a round step (1, 2 or 5 x 10^k; with whole_numbers at least 1) from
// `lo` to `hi`, both ticks, which cover [min, max]; at most about `max_ticks` of them. Needs
// min < max, both finite.
struct ChartAxis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};
ChartAxis round_axis(double min, double max, int max_ticks, bool whole_numbers);

// The <svg> element, `width` x `height` pixels.
std::string render_line_chart(const LineChart& chart, int width, int height);

}  // namespace kiln
