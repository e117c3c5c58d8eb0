// A horizontal bar chart as one inline <svg> element, for `kiln lab`'s page (lab_report.h): a
// title, a row per thing measured with its label on the left and a bar from zero to its value, the
// value's text at the bar's end, and an axis below with ticks at round numbers (round_axis,
// svg_chart.h). One row may be the baseline the others are compared with: its bar has a colour of
// its own, named in a small legend. A row without a value (an experiment that could not run)
// shows its label and its note ("not run: <reason>") where the bar would be.
//
// The axis spans zero and every finite value; a negative value's bar runs left of zero. A
// non-finite value counts as no value. Each bar is a <rect class="bar">, and nothing else in the
// chart is a <rect>, so a page's bars can be counted. The width is given; the height follows
// from the number of rows (bar_chart_height). No script, no external resource, no fonts but the
// generic sans-serif. All text is escaped (svg_markup.h). Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct BarRow {
  std::string label;            // left of the bar: "workers 4, pinned on"
  std::optional<double> value;  // the bar's length; empty: no bar, the note instead
  std::string value_text;       // at the bar's end; empty: the value as "{:g}"
  std::string note;             // in place of the bar where there is no value; empty: "no value"
  bool baseline = false;        // drawn in baseline_colour
};

struct BarChart {
  std::string title;
  std::string value_label;  // under the axis: "samples/s"
  std::vector<BarRow> rows;
  std::string colour = "#4c78a8";           // a CSS colour for the bars
  std::string baseline_colour = "#f58518";  // and for the baseline's bar and its legend swatch
};

// The <svg> element, `width` pixels wide and bar_chart_height(chart.rows.size()) high.
std::string render_bar_chart(const BarChart& chart, int width);
int bar_chart_height(size_t rows);

}  // namespace kiln
