// `kiln lab --report`'s page (obs/lab_report.h) and its horizontal bar chart (obs/svg_bar_chart.h):
// bars as long as their values on a round axis from zero, the baseline's bar in its own colour, a
// row that did not run showing why, escaped text; the page with every lab's title, question, rows,
// numbers and reasons, and nothing it could fetch or run; a write that fails naming the path; and
// the page of three labs (one not run at all) drawn in headless Chromium with every bar that ran.
#include "kiln/obs/lab_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "kiln/obs/svg_bar_chart.h"
#include "support/chromium.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"
#include "support/text_search.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::TempDir;

using testing::count;
using testing::contains;

struct DrawnBar {
  double x = 0, width = 0;
  std::string colour;
};

// The chart's bars, in order, as the <rect class="bar"> elements give them.
std::vector<DrawnBar> bars_of(const std::string& svg) {
  static const std::regex rect(R"re(<rect class="bar" x="([0-9.-]+)" y="[0-9.-]+" width="([0-9.]+)" height="16" )re"
                               R"re(fill="(#[0-9a-f]{6})"/>)re");
  std::vector<DrawnBar> bars;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it)
    bars.push_back({std::stod((*it)[1]), std::stod((*it)[2]), (*it)[3]});
  return bars;
}

TEST(SvgBarChart, BarsAreAsLongAsTheirValuesFromZero) {
  BarChart chart{"Lab 1: samples/s", "samples/s", {}};
  chart.rows.push_back({"workers 0", 100.0, "100 (1.00x)", "", /*baseline=*/true});
  chart.rows.push_back({"workers 2", 50.0, "", "", false});
  chart.rows.push_back({"workers 4", 25.0, "", "", false});
  const std::string svg = render_bar_chart(chart, 600);
  EXPECT_TRUE(svg.starts_with(fmt::format(R"(<svg class="chart" width="600" height="{}")", bar_chart_height(3))))
      << svg;
  EXPECT_TRUE(svg.ends_with("</svg>"));
  EXPECT_EQ(count(svg, "<rect"), 3u);  // the bars and nothing else

  const std::vector<DrawnBar> bars = bars_of(svg);
  ASSERT_EQ(bars.size(), 3u) << svg;
  for (const DrawnBar& bar : bars) EXPECT_DOUBLE_EQ(bar.x, bars[0].x);  // all from zero
  EXPECT_GT(bars[0].width, 300);
  EXPECT_NEAR(bars[1].width, bars[0].width / 2, 0.1);
  EXPECT_NEAR(bars[2].width, bars[0].width / 4, 0.1);

  // The baseline in its own colour, named in the legend; the others in the bars' colour.
  EXPECT_EQ(bars[0].colour, chart.baseline_colour);
  EXPECT_EQ(bars[1].colour, chart.colour);
  EXPECT_EQ(bars[2].colour, chart.colour);
  EXPECT_NE(chart.colour, chart.baseline_colour);
  EXPECT_TRUE(contains(svg, ">baseline</text>")) << svg;

  // Values at the bars' ends (the given text, else the value), ticks at round numbers from 0 to 100.
  for (const char* text : {">Lab 1: samples/s<", ">workers 0<", ">workers 4<", ">100 (1.00x)<", ">50<", ">25<",
                           ">samples/s<", ">0<", ">20<", ">100<"})
    EXPECT_TRUE(contains(svg, text)) << text << "\n" << svg;
  EXPECT_FALSE(contains(svg, ">120<")) << svg;  // the axis ends at the longest bar's round value
}

TEST(SvgBarChart, MoreRowsMakeATallerChart) {
  EXPECT_EQ(bar_chart_height(0), bar_chart_height(1));  // room for the line saying there are none
  EXPECT_EQ(bar_chart_height(4) - bar_chart_height(3), bar_chart_height(3) - bar_chart_height(2));
  EXPECT_GT(bar_chart_height(3), bar_chart_height(2));
  const std::string empty = render_bar_chart({"Nothing", "samples/s", {}}, 400);
  EXPECT_TRUE(contains(empty, ">no rows</text>")) << empty;
  EXPECT_EQ(count(empty, "<rect"), 0u);
}

TEST(SvgBarChart, ARowWithoutAValueShowsItsNoteInsteadOfABar) {
  BarChart chart{"Precision", "samples/s", {}};
  chart.rows.push_back({"fp32", 80.0, "", "", true});
  chart.rows.push_back({"bf16", std::nullopt, "", "not run: the CPU back-end has no bf16 matmul", false});
  chart.rows.push_back({"fp16", std::nan(""), "", "", false});  // not finite: no bar either
  const std::string svg = render_bar_chart(chart, 500);
  EXPECT_EQ(bars_of(svg).size(), 1u) << svg;
  EXPECT_TRUE(contains(svg, ">bf16</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">not run: the CPU back-end has no bf16 matmul</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">fp16</text>")) << svg;
  EXPECT_TRUE(contains(svg, ">no value</text>")) << svg;
  EXPECT_FALSE(contains(svg, "nan")) << svg;
}

TEST(SvgBarChart, ANegativeValueRunsLeftOfZero) {
  const std::string svg =
      render_bar_chart({"Change", "%", {{"slower", -20.0, "", "", false}, {"faster", 40.0, "", "", false}}}, 600);
  const std::vector<DrawnBar> bars = bars_of(svg);
  ASSERT_EQ(bars.size(), 2u) << svg;
  EXPECT_NEAR(bars[0].x + bars[0].width, bars[1].x, 0.1);  // both from zero
  EXPECT_NEAR(bars[1].width, 2 * bars[0].width, 0.1);
  for (const char* text : {">-20<", ">0<", ">40<"}) EXPECT_TRUE(contains(svg, text)) << text << "\n" << svg;
  // Too narrow for its labels: still a chart with its bar.
  EXPECT_EQ(bars_of(render_bar_chart({"", "", {{"a long label", 1.0, "", "", false}}}, 100)).size(), 1u);
}

TEST(SvgBarChart, NoBaselineNoLegend) {
  const std::string svg = render_bar_chart({"Storage", "samples/s", {{"a", 3.0, "", "", false}}}, 400);
  EXPECT_FALSE(contains(svg, "baseline")) << svg;
}

TEST(SvgBarChart, TextIsEscaped) {
  BarChart chart{"a & b", "<i>samples</i>", {}};
  chart.rows.push_back({"<script>alert('x')</script>", 2.0, "\"2\"", "", true});
  chart.rows.push_back({"ok", std::nullopt, "", "not run: </svg>", false});
  chart.colour = "\"><script>";
  const std::string svg = render_bar_chart(chart, 500);
  EXPECT_FALSE(contains(svg, "<script")) << svg;
  EXPECT_FALSE(contains(svg, "<i>")) << svg;
  EXPECT_EQ(count(svg, "</svg>"), 1u) << svg;
  for (const char* text :
       {">&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;<", ">a &amp; b<", "aria-label=\"a &amp; b\"",
        ">&lt;i&gt;samples&lt;/i&gt;<", ">&quot;2&quot;<", ">not run: &lt;/svg&gt;<"})
    EXPECT_TRUE(contains(svg, text)) << text << "\n" << svg;
}

LabMeasurement measurement(double samples_per_second, double ratio) {
  LabMeasurement m;
  m.samples_per_second = samples_per_second;
  m.step_ms = 8000.0 / samples_per_second;  // a global batch of 8
  m.peak_memory_bytes = 52'428'800;         // 50 MiB
  m.data_wait_share = 0.125;
  m.ratio = ratio;
  m.final_loss = 4.1;
  return m;
}

// What `kiln lab` on a CPU might find: pre-loading with one row it could not run, precision not
// run at all, and two data-parallel ranks.
LabResults three_labs() {
  LabResults results;
  results.model = "GPT 4 layers x 128, seq 128, vocab 512, batch 8";
  results.machine = "cpu (2 cores)";
  results.warmup_iters = 3;
  results.timed_iters = 10;

  LabExperiment preload{
      1, "Data pre-loading", "How much do loader workers and pinned memory hide the data wait?", {}, ""};
  preload.rows.push_back({"workers 0", {{"num_workers", "0"}}, 1, true, measurement(640.0, 1.0), ""});
  preload.rows.push_back(
      {"workers 4", {{"num_workers", "4"}, {"pin_memory", "false"}}, 1, false, measurement(1184.0, 1.85), ""});
  preload.rows.push_back({"workers 4, pinned on",
                          {{"num_workers", "4"}, {"pin_memory", "true"}},
                          1,
                          false,
                          std::nullopt,
                          "pinned memory needs a CUDA device"});
  results.labs.push_back(preload);

  LabExperiment precision{3, "Precision", "What do bf16 and fp8 buy over fp32?", {}, "needs a CUDA device"};
  results.labs.push_back(precision);

  LabExperiment ranks{6, "Data-parallel ranks", "How does throughput scale with ranks on one machine?", {}, ""};
  ranks.rows.push_back({"1 rank", {}, 1, true, measurement(612.4, 1.0), ""});
  ranks.rows.push_back({"2 ranks", {{"dist_backend", "gloo"}}, 2, false, measurement(1102.4, 1.8), ""});
  results.labs.push_back(ranks);
  return results;
}

TEST(LabReport, PageHasEveryLabsTitleRowsNumbersAndReasons) {
  const std::string html = render_lab_report(three_labs());
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  // Self-contained: nothing fetched, no script.
  EXPECT_TRUE(contains(html,
                       "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                       "style-src 'unsafe-inline'\">"));
  for (const char* outside : {"<script", "http:", "https:", " src=", " href=", "url(", "@import"})
    EXPECT_FALSE(contains(html, outside)) << outside;

  for (const char* line : {"<tr><th>model</th><td>GPT 4 layers x 128, seq 128, vocab 512, batch 8</td></tr>",
                           "<tr><th>machine</th><td>cpu (2 cores)</td></tr>",
                           "<tr><th>iterations</th><td>3 warm-up, 10 timed (step time: their median)</td></tr>",
                           "<h2>Lab 1: Data pre-loading</h2>",
                           "<p class=\"question\">How much do loader workers and pinned memory hide the data wait?</p>",
                           "<h2>Lab 3: Precision</h2>", "<h2>Lab 6: Data-parallel ranks</h2>"})
    EXPECT_TRUE(contains(html, line)) << line << "\n" << html;

  // A chart a lab that ran, with a bar a row that ran.
  EXPECT_EQ(count(html, "<svg class=\"chart\""), 2u);
  EXPECT_EQ(count(html, "<rect class=\"bar\""), 4u);
  EXPECT_TRUE(contains(html, "aria-label=\"Lab 1: samples/s\""));
  EXPECT_TRUE(contains(html, ">1,184 (1.85\u00d7)</text>")) << html;
  EXPECT_TRUE(contains(html, ">not run: pinned memory needs a CUDA device</text>")) << html;

  // The table: every row, its settings, its numbers or why it did not run.
  EXPECT_TRUE(contains(html,
                       "<tr><th>workers 0 (baseline)</th><td class=\"settings\">num_workers=0</td>"
                       "<td class=\"number\">640</td><td class=\"number\">12.50</td><td class=\"number\">50.0</td>"
                       "<td class=\"number\">12.5</td><td class=\"number\">1.00\u00d7</td></tr>"))
      << html;
  EXPECT_TRUE(contains(html,
                       "<tr><th>workers 4</th><td class=\"settings\">num_workers=4, pin_memory=false</td>"
                       "<td class=\"number\">1,184</td><td class=\"number\">6.76</td>"))
      << html;
  EXPECT_TRUE(contains(html,
                       "<tr><th>workers 4, pinned on</th><td class=\"settings\">num_workers=4, pin_memory=true</td>"
                       "<td class=\"missing\" colspan=\"5\">not run: pinned memory needs a CUDA device</td></tr>"))
      << html;
  EXPECT_TRUE(contains(html, "<tr><th>1 rank (baseline)</th><td class=\"settings\">base configuration</td>")) << html;
  EXPECT_TRUE(contains(html,
                       "<tr><th>2 ranks</th><td class=\"settings\">dist_backend=gloo, ranks=2</td>"
                       "<td class=\"number\">1,102</td><td class=\"number\">7.26</td><td class=\"number\">50.0</td>"
                       "<td class=\"number\">12.5</td><td class=\"number\">1.80\u00d7</td></tr>"))
      << html;

  // The lab that could not run: its reason, no chart or table.
  const size_t precision = html.find("<h2>Lab 3: Precision</h2>"), ranks = html.find("<h2>Lab 6:");
  const std::string section = html.substr(precision, ranks - precision);
  EXPECT_EQ(section,
            "<h2>Lab 3: Precision</h2>\n<p class=\"question\">What do bf16 and fp8 buy over fp32?</p>\n"
            "<p class=\"missing\">Not run here: needs a CUDA device</p>\n");
  EXPECT_EQ(count(html, "<table class=\"lab\">"), 2u);
}

TEST(LabReport, SmallThroughputsKeepThreeDigits) {
  LabResults results = three_labs();
  results.labs[0].rows[0].measured = measurement(42.456, 1.0);
  results.labs[0].rows[0].measured->step_ms = 188.4321;
  results.labs[0].rows[0].measured->peak_memory_bytes = 1536 * 1024;
  results.labs[0].rows[0].measured->data_wait_share = 0.00049;
  const std::string html = render_lab_report(results);
  EXPECT_TRUE(contains(html,
                       "<td class=\"number\">42.5</td><td class=\"number\">188.43</td><td class=\"number\">1.5</td>"
                       "<td class=\"number\">0.0</td>"))
      << html;
}

TEST(LabReport, TextFromTheResultsIsEscaped) {
  LabResults results = three_labs();
  results.model = "<script>alert('x')</script>";
  results.machine = "a & b";
  results.labs[0].title = "</h2><b>bold";
  results.labs[0].rows[1].name = "<b>row</b>";
  results.labs[0].rows[1].settings = {{"data_path", "\"/tmp/<x>\""}};
  results.labs[0].rows[2].unavailable = "</td></table>";
  results.labs[1].unavailable = "<img>";
  const std::string html = render_lab_report(results);
  for (const char* raw : {"<script", "<b>", "<img", "</td></table>"}) EXPECT_FALSE(contains(html, raw)) << raw;
  for (const char* text : {"<td>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;</td>", "<td>a &amp; b</td>",
                           "<h2>Lab 1: &lt;/h2&gt;&lt;b&gt;bold</h2>", "<tr><th>&lt;b&gt;row&lt;/b&gt;</th>",
                           ">&lt;b&gt;row&lt;/b&gt;</text>", "data_path=&quot;/tmp/&lt;x&gt;&quot;</td>",
                           "not run: &lt;/td&gt;&lt;/table&gt;</td>", "Not run here: &lt;img&gt;</p>"})
    EXPECT_TRUE(contains(html, text)) << text << "\n" << html;
}

TEST(LabReport, AFailedWriteIsAnErrorNamingThePath) {
  const TempDir dir;
  testing::write_file_bytes(dir / "a-file", "x");
  const std::string output = dir / "a-file/lab.html";
  const std::string error = testing::error_of([&] { write_lab_report(three_labs(), output); });
  EXPECT_TRUE(error.starts_with("cannot write the lab report '" + output + "': ")) << error;
  EXPECT_FALSE(std::filesystem::exists(output));

  write_lab_report(three_labs(), dir / "lab.html");
  EXPECT_EQ(testing::read_file_bytes(dir / "lab.html"), render_lab_report(three_labs()));
}

// The screenshot shows both bar colours in about as many pixels as the bars' rectangles cover (and
// the baseline's legend swatches), and the same page with the bars taken out shows only the
// swatches: every row that ran is drawn as a bar.
TEST(LabReport, ChromiumDrawsABarForEveryRowThatRan) {
  const std::string chromium = testing::chromium_binary();
  ASSERT_FALSE(chromium.empty()) << "headless Chromium draws the report in this test: run scripts/install-deps.sh "
                                    "(it installs Debian's chromium; CI runs it)";
  const TempDir work;
  const LabResults results = three_labs();
  write_lab_report(results, work / "lab.html");
  const std::string page = testing::read_file_bytes(work / "lab.html");
  const std::vector<DrawnBar> bars = bars_of(page);
  ASSERT_EQ(bars.size(), 4u);  // the rows that ran
  testing::write_file_bytes(work / "without-bars.html", std::regex_replace(page, std::regex("<rect [^>]*/>"), ""));

  const BarChart defaults;
  const std::vector<std::string> colours = {defaults.colour, defaults.baseline_colour};
  constexpr double kBarHeight = 16, kSwatch = 12 * 10;  // a legend swatch: a line 12 px long, 10 wide
  const double swatches = kSwatch * 2;                  // both labs that ran have a baseline
  // The bars' area, less and more a pixel at each edge (blended with the background where an edge
  // falls between pixels): far from the area a bar adds, at least 2,500 pixels here.
  std::map<std::string, double> low, high;
  for (const DrawnBar& bar : bars) {
    low[bar.colour] += (bar.width - 2) * (kBarHeight - 2);
    high[bar.colour] += (bar.width + 2) * (kBarHeight + 2);
  }
  for (const auto& [html, with_bars] : {std::pair{work / "lab.html", true}, {work / "without-bars.html", false}}) {
    SCOPED_TRACE(html);
    const std::string png = work / (with_bars ? "with-bars.png" : "without-bars.png");
    const CommandResult shot = testing::screenshot(chromium, html, png, 1400, 1400, work.path());
    ASSERT_EQ(shot.exit_code, 0) << shot.output;
    const std::map<std::string, int64_t> pixels = testing::count_colours(png, colours);
    ASSERT_EQ(pixels.size(), colours.size());
    const auto drawn = [&](const std::string& colour) { return static_cast<double>(pixels.at(colour)); };
    if (with_bars) {
      EXPECT_GE(drawn(defaults.colour), low[defaults.colour]);
      EXPECT_LE(drawn(defaults.colour), high[defaults.colour]);
      EXPECT_GE(drawn(defaults.baseline_colour), low[defaults.baseline_colour] + swatches / 2);
      EXPECT_LE(drawn(defaults.baseline_colour), high[defaults.baseline_colour] + swatches);
    } else {
      EXPECT_EQ(drawn(defaults.colour), 0);
      EXPECT_GE(drawn(defaults.baseline_colour), swatches / 2);  // the legends alone
      EXPECT_LE(drawn(defaults.baseline_colour), swatches);
    }
  }
}

}  // namespace
}  // namespace kiln
