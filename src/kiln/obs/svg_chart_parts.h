// What the report pages' SVG charts (svg_chart.h's line charts, svg_bar_chart.h's bar charts) share:
// the map from an axis's values to pixels, a tick's text, and the opening <svg> tag with the
// chart's title. Pure, thread-safe.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <string_view>

#include "kiln/obs/svg_markup.h"

namespace kiln {

// Where a value falls on the page: the axis [lo, hi] onto pixels [from, to] (to < from runs up
// the page).
struct ChartScale {
  double lo, hi, from, to;
  double operator()(double value) const { return from + (value - lo) / (hi - lo) * (to - from); }
};

// A tick as "{:g}", with no "-0" or "1e-17" where the multiples of `step` left a remainder at zero.
inline std::string chart_tick_label(double tick, double step) {
  return fmt::format("{:g}", std::abs(tick) < step * 1e-9 ? 0.0 : tick);
}

// The opening <svg class="chart"> tag, `width` x `height` pixels, labelled with the title for
// screen readers, in 12 px sans-serif; and the title in bold 14 px at (title_x, 17).
inline std::string chart_svg_start(std::string_view title, int width, int height, double title_x) {
  const std::string escaped = escape_markup(title);
  std::string svg =
      fmt::format(R"(<svg class="chart" width="{0}" height="{1}" viewBox="0 0 {0} {1}" role="img" aria-label="{2}" )"
                  R"(font-family="sans-serif" font-size="12" fill="#333">)",
                  width, height, escaped);
  return svg + fmt::format(R"(<text x="{}" y="17" font-size="14" font-weight="bold">{}</text>)", title_x, escaped);
}

}  // namespace kiln
