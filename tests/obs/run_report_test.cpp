// `kiln report` (obs/run_report.h, cli/report.cpp) end to end: the page of a tiny resumed run with
// every TensorBoard switch on (its summary, six charts, the estimate beside the measurements, the
// config of its last start), drawn in headless Chromium with every chart's lines in the screenshot;
// a run without the timers or memory naming the flags that add them; escaping; and bad inputs, each
// an error naming the culprit with exit status 1.
#include "kiln/obs/run_report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "kiln/obs/run_report_charts.h"
#include "kiln/obs/run_report_prediction.h"
#include "kiln/obs/tensorboard_format.h"
#include "kiln/obs/tensorboard_observer.h"
#include "obs/event_file_reader.h"
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

// A tiny run of 3 iterations resumed to 6 (two event files), every TensorBoard switch on, and its
// report: made once for the tests of this suite.
class RunReportOfATinyRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const std::string train =
        "train --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --vocab-size 64 --mock-data "
        "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --eval-iters 1 --eval-interval 2 --num-workers 0 "
        "--save {0}/ckpt --load {0}/ckpt --tensorboard-dir {0}/tb --log-timers-to-tensorboard "
        "--log-memory-to-tensorboard --train-iters {1}";
    for (const int iterations : {3, 6}) {
      const CommandResult run = testing::run_kiln(fmt::format(fmt::runtime(train), dir_->path(), iterations));
      ASSERT_EQ(run.exit_code, 0) << run.output;
    }
    report_ = testing::run_kiln("report " + *dir_ / "tb");
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string tb() { return *dir_ / "tb"; }
  static std::string page() { return testing::read_file_bytes(*dir_ / "tb/report.html"); }

  static TempDir* dir_;
  static CommandResult report_;
};

TempDir* RunReportOfATinyRun::dir_ = nullptr;
CommandResult RunReportOfATinyRun::report_;

TEST_F(RunReportOfATinyRun, PageHasTheSummaryChartsPredictionAndConfig) {
  ASSERT_EQ(report_.exit_code, 0) << report_.output;
  EXPECT_EQ(report_.output, tb() + "/report.html\n");  // the path written
  const std::string html = page();
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  // Self-contained: nothing fetched, no script.
  EXPECT_TRUE(contains(html, "content=\"default-src 'none'; style-src 'unsafe-inline'\""));
  for (const char* outside : {"<script", "http:", "https:", " src=", " href=", "url(", "@import"})
    EXPECT_FALSE(contains(html, outside)) << outside;

  EXPECT_TRUE(contains(html, "<tr><th>event files</th><td>2 (events.out.tfevents.")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>device</th><td>cpu")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>iterations</th><td>1 to 6</td></tr>")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>samples</th><td>24</td></tr>")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>last validation loss</th><td>")) << html;
  EXPECT_TRUE(std::regex_search(html, std::regex("<tr><th>tokens per second</th><td>[0-9,]+ \\(mean\\)</td>"))) << html;

  EXPECT_EQ(count(html, "<svg class=\"chart\""), 6u);
  for (const char* title :
       {"Loss", "Learning rate", "Gradient norm", "Throughput", "Time per iteration", "Memory per GPU"})
    EXPECT_TRUE(contains(html, fmt::format("aria-label=\"{}\"", title))) << title;
  EXPECT_TRUE(contains(html, "Device memory: &#39;mem-reserved-bytes&#39; equals kiln&#39;s buffers")) << html;

  // Predicted beside measured: memory both ways with their ratio; no time predicted on a CPU.
  EXPECT_TRUE(std::regex_search(
      html, std::regex("<tr><th>memory per GPU \\(kiln&#39;s buffers\\)</th><td>[0-9.]+ KiB</td><td>[0-9.]+ KiB "
                       "\\(peak\\)</td><td>[0-9.]+\u00d7</td></tr>")))
      << html;
  EXPECT_TRUE(contains(html,
                       "<tr><th>time per iteration</th><td>not predicted: kiln estimate times the GPUs of its "
                       "datasheet table (kiln estimate --gpu) alone, not &#39;cpu"))
      << html;
  EXPECT_TRUE(std::regex_search(html, std::regex("<tr><th>parameters</th><td>[0-9,]+</td>"))) << html;

  // The config of the run's last start.
  EXPECT_TRUE(contains(html, "<tr><th>hidden_size</th><td>16</td></tr>")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>train_iters</th><td>6</td></tr>")) << html;
}

// The screenshot shows each series' colour in as many pixels as a line across a chart has (a
// legend's swatch has 36), and the same page with the lines taken out does not.
TEST_F(RunReportOfATinyRun, ChromiumDrawsTheLinesOfEveryChart) {
  ASSERT_EQ(report_.exit_code, 0) << report_.output;
  const std::string chromium = testing::chromium_binary();
  ASSERT_FALSE(chromium.empty()) << "headless Chromium draws the report in this test: run scripts/install-deps.sh "
                                    "(it installs Debian's chromium; CI runs it)";
  const TempDir work;
  const std::string without_lines = std::regex_replace(
      page(), std::regex(R"(<path d="M[^"]*" fill="none" stroke="#[0-9a-f]{6}"[^>]*/>|<circle[^>]*/>)"), "");
  ASSERT_LT(without_lines.size(), page().size());
  testing::write_file_bytes(work / "without-lines.html", without_lines);
  const ReportColours colours;
  const std::vector<std::string> drawn = {std::string(colours.training_loss), std::string(colours.validation_loss),
                                          std::string(colours.learning_rate), std::string(colours.grad_norm),
                                          std::string(colours.throughput),    std::string(colours.iteration_time),
                                          std::string(colours.memory),        std::string(colours.predicted_memory)};
  constexpr int64_t kLineAcrossAChart = 200;
  for (const auto& [html, with_lines] :
       {std::pair{tb() + "/report.html", true}, {work / "without-lines.html", false}}) {
    SCOPED_TRACE(html);
    const std::string png = work / (with_lines ? "with-lines.png" : "without-lines.png");
    const CommandResult shot = testing::screenshot(chromium, html, png, 1400, 1400, work.path());
    ASSERT_EQ(shot.exit_code, 0) << shot.output;
    std::vector<std::string> asked = drawn;
    asked.emplace_back(colours.device_memory);  // a CPU run: not on the page at all
    const std::map<std::string, int64_t> pixels = testing::count_colours(png, asked);
    ASSERT_EQ(pixels.size(), asked.size());
    for (const std::string& colour : drawn) {
      if (with_lines) {
        EXPECT_GE(pixels.at(colour), kLineAcrossAChart) << colour;
      } else {
        EXPECT_LT(pixels.at(colour), kLineAcrossAChart / 2) << colour << ": the legend alone";
      }
    }
    EXPECT_EQ(pixels.at(std::string(colours.device_memory)), 0);
  }
}

TEST_F(RunReportOfATinyRun, BadInputsAreErrorsNamingTheCulprit) {
  const TempDir dir;
  const auto fails_with = [](const std::string& arguments, const std::string& message) {
    const CommandResult result = testing::run_kiln("report " + arguments);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_TRUE(contains(result.output, "kiln: error: " + message)) << result.output;
  };
  std::filesystem::create_directories(dir / "empty");
  fails_with(dir / "empty", "no TensorBoard event files (events.out.tfevents.*) in '" + dir / "empty" +
                                "': give the --tensorboard-dir of a kiln train run");
  fails_with(dir / "missing", "cannot report on '" + dir / "missing" + "': there is no such folder");

  const std::string events = testing::event_files_in(tb()).at(0);
  const std::string bytes = testing::read_file_bytes(events);
  std::filesystem::create_directories(dir / "cut");
  testing::write_file_bytes(dir / "cut/events.out.tfevents.1", bytes.substr(0, bytes.size() - 3));
  fails_with(dir / "cut", "TensorBoard event file '" + dir / "cut/events.out.tfevents.1" + "' is damaged at byte ");
  std::filesystem::create_directories(dir / "flipped");
  std::string flipped = bytes;
  flipped[40] ^= 0x08;
  testing::write_file_bytes(dir / "flipped/events.out.tfevents.1", flipped);
  fails_with(dir / "flipped",
             "TensorBoard event file '" + dir / "flipped/events.out.tfevents.1" + "' is damaged at byte ");
  std::filesystem::create_directories(dir / "unreadable/events.out.tfevents.1");
  fails_with(dir / "unreadable",
             "cannot read TensorBoard event file '" + dir / "unreadable/events.out.tfevents.1" + "': Is a directory");

  testing::write_file_bytes(dir / "a-file", "x");
  fails_with(tb() + " --output " + dir / "a-file/report.html",
             "cannot write the report '" + dir / "a-file/report.html" + "'");
  EXPECT_FALSE(std::filesystem::exists(dir / "a-file/report.html"));
}

// What a run of a few iterations writes without --log-timers-to-tensorboard, --log-memory-to-tensorboard
// or validation, with the config and estimate a CPU run records.
std::string report_of_a_run_without_switches(const TempDir& dir) {
  {
    TensorBoardObserver observer(TensorBoardWriter::create_in(dir / "tb", 100), {}, 0);
    Config config;
    config.vocab_size = 64;
    config.resolve();
    observer.write_run_start(to_yaml(config), to_json(predict_run(config, "cpu, 2 threads")), 0);
    for (int64_t it = 1; it <= 3; ++it) {
      IterationStats stats;
      stats.iteration = it;
      stats.consumed_samples = 8 * it;
      stats.lm_loss = 4.0 - 0.1 * static_cast<double>(it);
      stats.learning_rate = 1e-4;
      stats.grad_norm = 1;
      observer.on_iteration(stats);
    }
  }
  return render_run_report(read_run_history(dir / "tb"));
}

TEST(RunReport, ChartsARunDidNotWriteNameTheFlagsThatAddThem) {
  const TempDir dir;
  const std::string html = report_of_a_run_without_switches(dir);
  EXPECT_EQ(count(html, "<svg class=\"chart\""), 3u);  // loss, learning rate, gradient norm
  for (const char* line :
       {"<p class=\"missing\">Throughput and time per iteration: not in the event files; kiln train "
        "--log-timers-to-tensorboard writes them.</p>",
        "<p class=\"missing\">Memory: not in the event files; kiln train --log-memory-to-tensorboard writes it.</p>",
        "<p class=\"missing\">Validation loss: none in the event files; kiln train validates every --eval-interval "
        "iterations with --eval-iters above 0.</p>",
        "<td>not measured: kiln train --log-memory-to-tensorboard measures it</td>",
        "<tr><th>time per iteration</th><td>not measured: kiln train --log-timers-to-tensorboard measures it</td>"})
    EXPECT_TRUE(contains(html, line)) << line << "\n" << html;
}

TEST(RunReport, ARunBeforeKilnWroteItsConfigAndEstimateSaysSo) {
  const TempDir dir;
  std::filesystem::create_directories(dir / "tb");
  std::string bytes;
  append_tf_record(bytes, encode_file_version_event(100));
  append_tf_record(bytes, encode_scalar_event(101, 1, "lm loss", 4.0f));
  testing::write_file_bytes(dir / "tb/events.out.tfevents.1", bytes);
  const std::string html = render_run_report(read_run_history(dir / "tb"));
  EXPECT_TRUE(contains(html, "<tr><th>device</th><td>unknown: the event files hold no estimate</td></tr>"));
  EXPECT_TRUE(contains(html, "The event files hold no estimate"));
  EXPECT_TRUE(contains(html, "The event files hold no config"));
  EXPECT_EQ(count(html, "<svg class=\"chart\""), 1u);
}

TEST(RunReport, TextFromTheEventFilesIsEscaped) {
  const TempDir dir;
  const std::string folder = dir / "a&b<c>";
  std::filesystem::create_directories(folder);
  std::string bytes;
  append_tf_record(bytes, encode_file_version_event(100));
  append_tf_record(bytes, encode_text_event(100, 0, "config", "data_path: <script>alert('x')</script>\n"));
  append_tf_record(bytes, encode_text_event(100, 0, "estimate",
                                            R"({"device": "</table><b>gpu", "gpu": "", "parameters": 1, )"
                                            R"("flops_per_iteration": 1, "tokens_per_iteration": 1, )"
                                            R"("data_parallel_size": 1, "memory_bytes_per_gpu": 1})"));
  append_tf_record(bytes, encode_scalar_event(101, 1, "lm loss", 4.0f));
  testing::write_file_bytes(folder + "/events.out.tfevents.1", bytes);
  const std::string html = render_run_report(read_run_history(folder));
  EXPECT_FALSE(contains(html, "<script")) << html;
  EXPECT_FALSE(contains(html, "<b>")) << html;
  EXPECT_TRUE(contains(html, "<td>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;</td>")) << html;
  EXPECT_TRUE(contains(html, "<td>&lt;/table&gt;&lt;b&gt;gpu</td>")) << html;
  EXPECT_TRUE(contains(html, "<title>kiln report: " + dir.path() + "/a&amp;b&lt;c&gt;</title>")) << html;
}

TEST(RunReport, AnEstimateThatIsNotKilnsJsonIsAnErrorNamingIt) {
  const TempDir dir;
  std::string bytes;
  append_tf_record(bytes, encode_file_version_event(100));
  append_tf_record(bytes, encode_text_event(100, 0, "estimate", "{\"device\": 3}"));
  testing::write_file_bytes(dir / "events.out.tfevents.1", bytes);
  EXPECT_EQ(testing::error_of([&] { render_run_report(read_run_history(dir.path())); }),
            "the 'estimate' text of the event files in '" + dir.path() + "': 'device' is 3, not a string");
}

}  // namespace
}  // namespace kiln
