// The report's SVG line chart (obs/svg_chart.h) and markup escaping (obs/svg_markup.h): round
// ticks, points placed on the plot's edges, lines broken at NaN, dots, escaped text.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "kiln/obs/svg_chart.h"
#include "kiln/obs/svg_markup.h"
#include "support/error_of.h"
#include "support/text_search.h"

namespace kiln {
namespace {

using testing::count;
TEST(SvgChart, AxesTickAtRoundNumbersCoveringTheData) {
  const ChartAxis loss = round_axis(2.13, 4.87, 6, false);
  EXPECT_DOUBLE_EQ(loss.step, 0.5);
  EXPECT_DOUBLE_EQ(loss.lo, 2.0);
  EXPECT_DOUBLE_EQ(loss.hi, 5.0);
  EXPECT_EQ(loss.ticks.size(), 7u);
  const ChartAxis rate = round_axis(0, 6e-4, 6, false);
  EXPECT_DOUBLE_EQ(rate.step, 1e-4);
  EXPECT_EQ(rate.ticks.size(), 7u);
  const ChartAxis iterations = round_axis(1, 4, 8, true);  // no half iterations
  EXPECT_DOUBLE_EQ(iterations.step, 1.0);
  EXPECT_EQ(iterations.ticks, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(round_axis(0, 130'000, 6, true).step, 50'000.0);
  EXPECT_EQ(testing::error_of([] { round_axis(1, 1, 6, false); }),
            "an axis needs finite min < max and a tick, got [1, 1] and 6");
}

TEST(SvgChart, PointsSpanThePlotAndNanBreaksTheLine) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LineChart chart{"Loss", "iteration", "cross-entropy", {}};
  chart.series.push_back({"training", "#1f77b4", {{1, 4.0}, {2, 3.0}, {3, nan}, {4, 2.5}, {5, 2.0}}});
  chart.series.push_back({"validation", "#d62728", {{2, 3.5}, {4, 3.0}}, /*dots=*/true});
  const std::string svg = render_line_chart(chart, 660, 300);
  EXPECT_TRUE(svg.starts_with("<svg class=\"chart\" width=\"660\" height=\"300\"")) << svg;
  EXPECT_TRUE(svg.ends_with("</svg>"));
  // x from 1 to 5 onto 68..644 px; y from 2 to 4 onto 258..50 px (the plot's margins).
  EXPECT_NE(svg.find(R"(d="M68.0 50.0 L212.0 154.0 M500.0 206.0 L644.0 258.0 ")"), std::string::npos) << svg;
  EXPECT_NE(svg.find(R"(d="M212.0 102.0 L500.0 154.0 ")"), std::string::npos) << svg;
  EXPECT_EQ(count(svg, "<circle"), 2u);              // validation's dots, none for the training line
  EXPECT_EQ(count(svg, R"(stroke="#d62728")"), 2u);  // its legend swatch and its line
  for (const char* text : {">Loss<", ">iteration<", ">cross-entropy<", ">training<", ">validation<", ">2.5<", ">5<"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
}

TEST(SvgChart, ASinglePointShowsAsADotOnAWidenedAxis) {
  const std::string svg =
      render_line_chart({"Memory", "iteration", "MiB", {{"peak", "#ff7f0e", {{3, 120.0}}}}, true}, 400, 200);
  EXPECT_EQ(count(svg, "<circle"), 1u);
  EXPECT_NE(svg.find(">0<"), std::string::npos) << "from zero: " << svg;
  EXPECT_NE(svg.find(">2<"), std::string::npos) << "the step widened to 2..4: " << svg;
  EXPECT_NE(svg.find(">4<"), std::string::npos) << svg;
}

TEST(SvgChart, TextIsEscaped) {
  EXPECT_EQ(escape_markup(R"(<a href="x">'b' & c</a>)"), "&lt;a href=&quot;x&quot;&gt;&#39;b&#39; &amp; c&lt;/a&gt;");
  const std::string svg =
      render_line_chart({"<script>", "x & y", "\"q\"", {{"</svg>", "red\"/><script>", {{0, 1}, {1, 2}}}}}, 300, 200);
  EXPECT_EQ(svg.find("<script"), std::string::npos) << svg;
  EXPECT_EQ(count(svg, "</svg>"), 1u) << svg;
  EXPECT_NE(svg.find("&lt;script&gt;"), std::string::npos);
  EXPECT_NE(svg.find("x &amp; y"), std::string::npos);
}

TEST(SvgChart, NoFiniteValueSaysSo) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg =
      render_line_chart({"Loss", "iteration", "loss", {{"training", "#1f77b4", {{1, nan}}}}}, 300, 200);
  EXPECT_NE(svg.find(">no finite values<"), std::string::npos) << svg;
  EXPECT_EQ(count(svg, "<circle"), 0u);
}

}  // namespace
}  // namespace kiln
