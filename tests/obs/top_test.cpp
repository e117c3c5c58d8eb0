// `kiln top`: frames rendered from readings given by hand (two GPUs with processes, no GPU, a run
// with its ETA, an endpoint that cannot be read), a run's readings and pace from its page, the
// --metrics values a user types, scrapes of pages that answer well and badly, the command's exit
// statuses, and the live view driven under tmux against a real `kiln train --metrics-port`:
// it refreshes in place, redraws for a narrower and a shorter pane, quits on q and on Ctrl-C,
// dies of a SIGTERM, and leaves the terminal as it found it every time.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dist/worker_group.h"
#include "kiln/obs/metrics_scrape.h"
#include "kiln/obs/nvml_library.h"
#include "kiln/obs/prometheus_observer.h"
#include "kiln/obs/prometheus_registry.h"
#include "kiln/obs/prometheus_server.h"
#include "kiln/obs/top_frame.h"
#include "kiln/obs/top_gpus.h"
#include "kiln/obs/top_reader.h"
#include "kiln/obs/top_run.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"
#include "support/tmux_session.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using testing::error_of;

constexpr double kMiB = 1 << 20, kGiB = 1 << 30;

// ---- frames from readings given by hand -------------------------------------------------------

TopGpu gpu(unsigned index, double utilization, double used_gib, std::vector<TopProcess> processes) {
  TopGpu gpu;
  gpu.index = index;
  gpu.name = "NVIDIA H100 80GB HBM3";
  gpu.reading.utilization_ratio = utilization;
  gpu.reading.memory_copy_utilization_ratio = utilization / 2;
  gpu.reading.memory_used_bytes = used_gib * kGiB;
  gpu.reading.memory_total_bytes = 80 * kGiB;
  gpu.reading.power_watts = 312.4;
  gpu.reading.temperature_celsius = 54;
  gpu.reading.sm_clock_hertz = 1980e6;
  gpu.reading.memory_clock_hertz = 2619e6;
  gpu.processes = std::move(processes);
  return gpu;
}

// Iteration 1000 of 3000 at 0.25 s a step: 2000 x 0.25 s = 500 s left.
TopRun run_at_iteration_1000() {
  TopRun run;
  run.endpoint = "127.0.0.1:9400";
  run.reading.rank = "0";
  run.reading.host = "node1";
  run.reading.iteration = 1000;
  run.reading.train_iterations = 3000;
  run.reading.lm_loss = 3.14159;
  run.reading.learning_rate = 3e-4;
  run.reading.tokens_per_second = 12345;
  run.pace.step_seconds = 0.25;
  run.pace.data_wait_fraction = 0.02;
  return run;
}

TEST(TopFrame, TwoGpusWithTheirProcessesAsGivenByHand) {
  TopFrame frame;
  frame.title = "kiln top  12:00:00  every 1 s, q quits";
  frame.gpus.gpus = {gpu(0, 0.45, 40,
                         {{.pid = 4242, .name = "kiln", .used_memory_bytes = 38.25 * kGiB},
                          {.pid = 77, .name = "", .used_memory_bytes = 512 * kMiB},
                          {.pid = 78, .name = "python3", .used_memory_bytes = std::nullopt}}),
                     gpu(1, 1.0, 0.5, {})};
  TopGpu& second = frame.gpus.gpus[1];
  second.name = "";
  second.reading.power_watts.reset();
  second.reading.utilization_ratio.reset();
  frame.runs = {run_at_iteration_1000()};
  EXPECT_EQ(render_top_frame(frame, 100),
            R"(kiln top  12:00:00  every 1 s, q quits

GPU 0  NVIDIA H100 80GB HBM3  power 312 W  temp 54 C  SM 1980 MHz  memory 2619 MHz
  util [|||||||||||||               ]  45%  mem [||||||||||||||              ] 40.0 GiB / 80.0 GiB
  pid    4242  kiln               38.2 GiB
  pid      77  ?                   512 MiB
  pid      78  python3                 n/a
GPU 1  ?  power n/a  temp 54 C  SM 1980 MHz  memory 2619 MHz
  util n/a                                  mem [                            ] 512 MiB / 80.0 GiB
  no processes

run 127.0.0.1:9400  rank 0  host node1
  iteration 1000 / 3000 [||||||||||||||||||                                    ]  33.3%  ETA 8m 20s
  loss 3.1416  lr 3.00e-04  tokens/s 12.3k  step 250.00 ms  data wait 2.0%
)");
}

TEST(TopFrame, WithoutAGpuItSaysWhyAndStillShowsTheRun) {
  TopFrame frame;
  frame.title = "kiln top";
  frame.gpus.none_because =
      "NVML is not loaded: libnvidia-ml.so.1: cannot open shared object file: No such file or "
      "directory";
  frame.runs = {run_at_iteration_1000()};
  EXPECT_EQ(render_top_frame(frame, 80),
            R"(kiln top

no GPU: NVML is not loaded: libnvidia-ml.so.1: cannot open shared object file:
  No such file or directory

run 127.0.0.1:9400  rank 0  host node1
  iteration 1000 / 3000 [|||||||||||                       ]  33.3%  ETA 8m 20s
  loss 3.1416  lr 3.00e-04  tokens/s 12.3k  step 250.00 ms  data wait 2.0%
)");
}

// The GPUs' processes that NVML would not list say why; a GPU of no processes says so.
TEST(TopFrame, ProcessesNvmlWouldNotListSayWhy) {
  TopFrame frame;
  frame.gpus.gpus = {gpu(3, 0, 1, {})};
  frame.gpus.gpus[0].processes_unknown = "NVML lists no processes: Insufficient Permissions";
  const std::string text = render_top_frame(frame, 100);
  EXPECT_NE(text.find("\nGPU 3  NVIDIA H100 80GB HBM3  power 312 W"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  processes: NVML lists no processes: Insufficient Permissions\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nrun: none followed; kiln top --metrics HOST:PORT follows one\n"),
            std::string::npos)
      << text;
}

// ETA = iterations left x the pace's seconds per iteration, in its two largest units; the rest
// of a run's readings show what the page had, and "n/a" for what it lacked.
TEST(TopFrame, EtaIsTheIterationsLeftTimesTheStepTime) {
  const auto progress_line = [](const TopRun& run) {
    const std::string text = render_top_frame({.title = "", .gpus = {}, .runs = {run}}, 120);
    const size_t start = text.find("  iteration");
    return text.substr(start, text.find('\n', start) - start);
  };
  const auto eta = [&](const TopRun& run) {
    const std::string line = progress_line(run);
    return line.substr(line.find("ETA"));
  };
  TopRun run = run_at_iteration_1000();
  EXPECT_EQ(eta(run), "ETA 8m 20s");  // 2000 x 0.25 s
  run.pace.step_seconds = 0.01;
  EXPECT_EQ(eta(run), "ETA 20s");
  run.pace.step_seconds = 2;
  EXPECT_EQ(eta(run), "ETA 1h 06m");  // 4000 s
  run.pace.step_seconds = 100;
  EXPECT_EQ(eta(run), "ETA 2d 07h");  // 200000 s
  run.pace.step_seconds.reset();
  EXPECT_EQ(eta(run), "ETA n/a");
  run.reading.iteration = 3000;
  EXPECT_EQ(eta(run), "ETA done");
  EXPECT_NE(progress_line(run).find(" 100.0%  ETA"), std::string::npos);
  run.reading.train_iterations.reset();
  EXPECT_EQ(progress_line(run), "  iteration 3000");

  TopRun full = run_at_iteration_1000();
  full.reading.validation_lm_loss = 3.5;
  full.reading.model_flops_utilization = 0.412;
  full.reading.skipped_iterations = 2;
  full.reading.tokens_per_second = 2.5e6;
  full.pace.step_seconds = 1.5;
  EXPECT_NE(render_top_frame({.title = "", .gpus = {}, .runs = {full}}, 200)
                .find("\n  loss 3.1416  val loss 3.5000  lr 3.00e-04  tokens/s 2.50M  step 1.50 s  "
                      "MFU 41.2%  data wait 2.0%  skipped 2\n"),
            std::string::npos);
  TopRun bare;
  bare.endpoint = "h:1";
  bare.reading.iteration = 5;
  const std::string text = render_top_frame({.title = "", .gpus = {}, .runs = {bare}}, 100);
  EXPECT_EQ(text.substr(text.find("run h:1")),
            "run h:1\n  iteration 5\n  loss n/a  lr n/a  tokens/s n/a  step n/a\n");
}

TEST(TopFrame, AnEndpointNotReadShowsWhy) {
  TopRun unreachable;
  unreachable.endpoint = "127.0.0.1:9401";
  unreachable.error =
      "unreachable: Failed to connect to 127.0.0.1 port 9401 after 0 ms: Couldn't connect to "
      "server";
  TopRun waiting;
  waiting.endpoint = "127.0.0.1:9402";
  EXPECT_EQ(render_top_frame({.title = "t",
                              .gpus = {.gpus = {}, .none_because = "none here"},
                              .runs = {unreachable, waiting, run_at_iteration_1000()}},
                             60),
            R"(t

no GPU: none here

run 127.0.0.1:9401
  unreachable: Failed to connect to 127.0.0.1 port 9401
    after 0 ms: Couldn't connect to server
run 127.0.0.1:9402
  no kiln_iterations_total yet: the run has not finished an
    iteration, or this is not a kiln run's page
run 127.0.0.1:9400  rank 0  host node1
  iteration 1000 / 3000 [|||||         ]  33.3%  ETA 8m 20s
  loss 3.1416  lr 3.00e-04  tokens/s 12.3k  step 250.00 ms
  data wait 2.0%
)");
}

// A narrow terminal gets lines no wider than itself; what came from outside cannot move the
// cursor (an escape shows as '?').
TEST(TopFrame, EveryLineFitsTheWidthAndControlCharactersShowAsQuestionMarks) {
  TopRun run = run_at_iteration_1000();
  run.reading.host = "evil\x1b[2J\nhost";
  TopFrame frame{.title = "kiln top", .gpus = {}, .runs = {run}};
  frame.gpus.gpus = {
      gpu(0, 0.5, 10, {{.pid = 1, .name = "a-very-long-process-name", .used_memory_bytes = kGiB}})};
  for (int width : {10, 40, 41, 57, 80}) {
    const std::string text = render_top_frame(frame, width);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      EXPECT_LE(static_cast<int>(line.size()), std::max(width, kMinTopWidth)) << line;
  }
  const std::string text = render_top_frame(frame, 100);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_NE(text.find("host evil?[2J?host"), std::string::npos) << text;
}

TEST(TopFrame, FitToHeightSaysHowManyLinesAreLeftOut) {
  EXPECT_EQ(fit_to_height("a\nb\nc\n", 3), "a\nb\nc\n");
  EXPECT_EQ(fit_to_height("a\nb\nc\n", 5), "a\nb\nc\n");
  EXPECT_EQ(fit_to_height("a\nb\nc\nd\n", 3), "a\nb\n(2 more lines)\n");
  EXPECT_EQ(fit_to_height("a\nb\n", 0), "(2 more lines)\n");
}

// ---- a run's readings -------------------------------------------------------------------------

// The page PrometheusObserver makes (the metric names kiln serves), read back.
TEST(TopRunReading, ReadsKilnsMetricsFromItsPage) {
  PrometheusRegistry registry({{"rank", "2"}, {"host", "node7"}});
  PrometheusObserver observer(registry, {.seq_length = 16, .peak_flops_per_second = 1e13});
  IterationStats stats;
  stats.iteration = 41;
  stats.train_iters = 100;
  stats.elapsed_ms = 250;
  stats.data_wait_ms = 50;
  stats.tflops_per_gpu = 4;
  stats.tokens_per_second = 640;
  stats.learning_rate = 1e-3;
  stats.lm_loss = 2.75;
  stats.skipped_iterations = 1;
  observer.on_iteration(stats);
  stats.iteration = 42;
  stats.elapsed_ms = 750;
  observer.on_iteration(stats);
  observer.on_validation({.iteration = 42, .lm_loss = 3.5, .perplexity = 33, .at_end = false, .classification = {}});
  const RunReading run = read_run(parse_prometheus_text(registry.render()));
  EXPECT_EQ(run.rank, "2");
  EXPECT_EQ(run.host, "node7");
  EXPECT_EQ(run.iteration, 42);
  EXPECT_EQ(run.train_iterations, 100);
  EXPECT_EQ(run.lm_loss, 2.75);
  EXPECT_EQ(run.validation_lm_loss, 3.5);
  EXPECT_EQ(run.learning_rate, 1e-3);
  EXPECT_EQ(run.tokens_per_second, 640);
  EXPECT_DOUBLE_EQ(*run.model_flops_utilization, 0.4);
  EXPECT_EQ(run.skipped_iterations, 1);
  EXPECT_DOUBLE_EQ(*run.data_wait_seconds, 0.1);
  EXPECT_EQ(run.step_seconds_sum, 1);
  EXPECT_EQ(run.step_count, 2);

  const RunReading empty = read_run({});
  EXPECT_EQ(empty.iteration, std::nullopt);
  EXPECT_EQ(empty.rank, "");
  EXPECT_EQ(run_pace(empty, nullptr).step_seconds, std::nullopt);
}

TEST(TopRunReading, PaceIsOverTheIterationsSinceTheEarlierReading) {
  RunReading before;
  before.step_seconds_sum = 10;
  before.step_count = 100;
  before.data_wait_seconds = 1;
  RunReading now = before;
  now.step_seconds_sum = 12;
  now.step_count = 110;
  now.data_wait_seconds = 1.5;
  const RunPace pace = run_pace(now, &before);
  EXPECT_DOUBLE_EQ(*pace.step_seconds, 0.2);  // 2 s over 10 iterations
  EXPECT_DOUBLE_EQ(*pace.data_wait_fraction, 0.25);
  const RunPace whole = run_pace(now, nullptr);
  EXPECT_DOUBLE_EQ(*whole.step_seconds, 12.0 / 110);
  EXPECT_DOUBLE_EQ(*whole.data_wait_fraction, 1.5 / 12);
  // No iterations since, or a run started again: the whole of the latest.
  EXPECT_DOUBLE_EQ(*run_pace(now, &now).step_seconds, 12.0 / 110);
  RunReading restarted = now;
  restarted.step_seconds_sum = 1;
  restarted.step_count = 4;
  EXPECT_DOUBLE_EQ(*run_pace(restarted, &now).step_seconds, 0.25);
}

// ---- endpoints and scrapes ---------------------------------------------------------------------

TEST(TopMetricsEndpoint, ReadsWhatAUserTypes) {
  const auto parsed = [](const std::string& text) {
    const MetricsEndpoint endpoint = parse_metrics_endpoint(text);
    return endpoint.host + " " + std::to_string(endpoint.port) + " " + endpoint.url();
  };
  EXPECT_EQ(parsed("9400"), "127.0.0.1 9400 http://127.0.0.1:9400/metrics");
  EXPECT_EQ(parsed("node-3.cluster:9401"),
            "node-3.cluster 9401 http://node-3.cluster:9401/metrics");
  EXPECT_EQ(parsed("[::1]:9402"), "::1 9402 http://[::1]:9402/metrics");
  EXPECT_EQ(parsed("http://127.0.0.1:9403/metrics"),
            "127.0.0.1 9403 http://127.0.0.1:9403/metrics");
  EXPECT_EQ(parsed("http://10.0.0.5:9404"), "10.0.0.5 9404 http://10.0.0.5:9404/metrics");
}

TEST(TopMetricsEndpoint, RefusesMalformedOnesNamingThem) {
  const std::string hint = " (give PORT, HOST:PORT, [IPV6]:PORT or http://HOST:PORT/metrics)";
  const auto error = [](const std::string& text) {
    return error_of([&] { parse_metrics_endpoint(text); });
  };
  EXPECT_EQ(error(""), "'' is not a metrics endpoint: it has no port" + hint);
  EXPECT_EQ(error("localhost"), "'localhost' is not a metrics endpoint: it has no port" + hint);
  EXPECT_EQ(error("host:"),
            "'host:' is not a metrics endpoint: the port '' is not a number" + hint);
  EXPECT_EQ(error(":9400"), "':9400' is not a metrics endpoint: the host is empty" + hint);
  EXPECT_EQ(error("host:94x"),
            "'host:94x' is not a metrics endpoint: the port '94x' is not a number" + hint);
  EXPECT_EQ(error("70000"),
            "'70000' is not a metrics endpoint: port 70000 is not in [1, 65535]" + hint);
  EXPECT_EQ(error("0"), "'0' is not a metrics endpoint: port 0 is not in [1, 65535]" + hint);
  EXPECT_EQ(error("::1:9400"),
            "'::1:9400' is not a metrics endpoint: an IPv6 address must be in brackets" + hint);
  EXPECT_EQ(error("fe80::1:9400"),
            "'fe80::1:9400' is not a metrics endpoint: an IPv6 address must be in brackets" + hint);
  EXPECT_EQ(error("[::1:9400"),
            "'[::1:9400' is not a metrics endpoint: the IPv6 address has no closing ']'" + hint);
  EXPECT_EQ(error("[::1]9400"),
            "'[::1]9400' is not a metrics endpoint: a ':PORT' must follow the ']'" + hint);
  EXPECT_EQ(
      error("bad host:1"),
      "'bad host:1' is not a metrics endpoint: 'bad host' is not a host name or address" + hint);
  EXPECT_EQ(
      error("http://h:1/status"),
      "'http://h:1/status' is not a metrics endpoint: kiln serves /metrics, not /status" + hint);
}

// Pages served here: kiln's text, garbage, an error status; and a port nobody listens on.
TEST(TopScrape, ReadsPagesAndSaysWhyNot) {
  PrometheusServer page("127.0.0.1", 0, [] {
    return std::string(
        "# TYPE kiln_iterations_total counter\nkiln_iterations_total{rank=\"1\"} 7\n");
  });
  PrometheusServer garbage("127.0.0.1", 0, [] { return std::string("<html>hello</html>\n"); });
  PrometheusServer failing("127.0.0.1", 0, []() -> std::string { throw Error("broken"); });
  const int closed = dist::find_free_port();
  const std::vector<MetricsScrape> scrapes = scrape_metrics({{"127.0.0.1", page.port()},
                                                             {"127.0.0.1", garbage.port()},
                                                             {"127.0.0.1", failing.port()},
                                                             {"127.0.0.1", closed}});
  ASSERT_EQ(scrapes.size(), 4u);
  EXPECT_EQ(scrapes[0].error, "");
  ASSERT_EQ(scrapes[0].samples.size(), 1u);
  EXPECT_EQ(scrapes[0].samples[0].value, 7);
  EXPECT_EQ(scrapes[1].error,
            "answered garbage: Prometheus text, line 1: a sample must start with a metric name: "
            "<html>hello</html>");
  EXPECT_EQ(scrapes[2].error, "answered HTTP 500");
  EXPECT_TRUE(scrapes[3].error.starts_with("unreachable: ")) << scrapes[3].error;
  EXPECT_NE(scrapes[3].error.find(std::to_string(closed)), std::string::npos) << scrapes[3].error;
}

// Reads faster than the run's iterations keep the pace of the last iterations seen.
TEST(TopReader, PaceStaysSteadyBetweenAdvances) {
  double seconds = 1, count = 10;
  PrometheusServer page("127.0.0.1", 0, [&] {
    return fmt::format(
        "kiln_iterations_total {0}\nkiln_iteration_duration_seconds_sum {1}\n"
        "kiln_iteration_duration_seconds_count {0}\n",
        count, seconds);
  });
  TopReader reader({{"127.0.0.1", page.port()}});
  const auto step = [&] { return reader.read("").runs.at(0).pace.step_seconds.value_or(-1); };
  EXPECT_DOUBLE_EQ(step(), 0.1);  // the whole run: nothing earlier
  seconds = 1.5, count = 20;
  EXPECT_DOUBLE_EQ(step(), 0.05);  // 0.5 s over the 10 since
  EXPECT_DOUBLE_EQ(step(), 0.05);  // no iteration since: the same window
  seconds = 1.6, count = 30;
  EXPECT_NEAR(step(), 0.01, 1e-12);
}

TEST(TopGpus, ProcessNamesComeFromProc) {
  EXPECT_EQ(process_name(static_cast<unsigned>(::getpid())), "kiln_tests");
  EXPECT_EQ(process_name(0), "");  // no process 0 in /proc
}

// On a machine with NVIDIA's driver: every GPU NVML sees, named, with its memory and processes.
TEST(TopGpus, ReadsEveryGpuNvmlSees) {
  std::string why_not;
  const std::unique_ptr<NvmlLibrary> nvml = NvmlLibrary::load(why_not);
  if (!nvml) GTEST_SKIP() << why_not;
  const TopGpus top = read_top_gpus(*nvml);
  ASSERT_FALSE(top.gpus.empty()) << top.none_because;
  for (const TopGpu& gpu : top.gpus) {
    EXPECT_FALSE(gpu.name.empty());
    ASSERT_TRUE(gpu.reading.memory_total_bytes);
    EXPECT_GT(*gpu.reading.memory_total_bytes, 1e9);
    for (const TopProcess& process : gpu.processes) EXPECT_GT(process.pid, 0u);
  }
  std::cout << render_top_frame({.title = "kiln top on this machine", .gpus = top, .runs = {}},
                                100);
}

// ---- the command -------------------------------------------------------------------------------

// What a run's frame says of the GPUs here: "GPU 0" where NVML loads, else its reason.
std::string expected_gpu_line() {
  std::string why_not;
  return NvmlLibrary::load(why_not) ? "\nGPU 0  " : "\nno GPU: NVML is not loaded: ";
}

TEST(TopCommand, OnceWithoutARunShowsTheGpusOrWhyNot) {
  const testing::CommandResult top = testing::run_kiln("top --once");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_TRUE(top.output.starts_with("kiln top  ")) << top.output;
  EXPECT_NE(top.output.find(expected_gpu_line()), std::string::npos) << top.output;
  EXPECT_NE(top.output.find("\nrun: none followed"), std::string::npos) << top.output;
}

TEST(TopCommand, OnceWithAnEndpointNotReadPrintsTheFrameAndFails) {
  const int closed = dist::find_free_port();
  const testing::CommandResult top =
      testing::run_kiln(fmt::format("top --once --metrics 127.0.0.1:{}", closed));
  EXPECT_EQ(top.exit_code, 1) << top.output;
  EXPECT_NE(top.output.find(expected_gpu_line()), std::string::npos) << top.output;
  EXPECT_NE(top.output.find(fmt::format("\nrun 127.0.0.1:{}\n  unreachable: ", closed)),
            std::string::npos)
      << top.output;
}

TEST(TopCommand, AMalformedMetricsValueIsAnErrorNamingIt) {
  const testing::CommandResult top =
      testing::run_kiln("top --once --metrics 9400 --metrics node:x");
  EXPECT_EQ(top.exit_code, 1) << top.output;
  EXPECT_EQ(top.output,
            "kiln: error: --metrics: 'node:x' is not a metrics endpoint: the port 'x' is not a "
            "number (give PORT, HOST:PORT, [IPV6]:PORT or http://HOST:PORT/metrics)\n");
  EXPECT_NE(testing::run_kiln("top --once --interval 0")
                .output.find("--interval must be in [0.1, 3600] seconds, got 0"),
            std::string::npos);
}

TEST(TopCommand, TheLiveViewNeedsATerminal) {
  const testing::CommandResult top = testing::run_kiln("top < /dev/null");
  EXPECT_EQ(top.exit_code, 1) << top.output;
  EXPECT_EQ(top.output,
            "kiln: error: kiln top shows a live view on a terminal, and standard input is not one: "
            "give --once to print one frame (watch -n 1 kiln top --once ... refreshes one)\n");
}

// ---- against a training run --------------------------------------------------------------------

constexpr int64_t kLongRun = 1'000'000;  // iterations: far more than the tests take

// Polls `probe` every 50 ms until it returns true or `seconds` pass.
bool eventually(double seconds, const std::function<bool()>& probe) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!probe()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// The iteration a captured frame shows, or -1.
int64_t shown_iteration(const std::string& screen) {
  std::smatch match;
  if (!std::regex_search(screen, match, std::regex(R"(iteration (\d+) / 1000000 \[)"))) return -1;
  return std::stoll(match[1]);
}

bool restored_mode(const std::string& stty) {
  return std::regex_search(stty, std::regex(R"((^|\s)icanon(\s|$))")) &&
         std::regex_search(stty, std::regex(R"((^|\s)echo(\s|$))")) &&
         std::regex_search(stty, std::regex(R"((^|\s)isig(\s|$))"));
}

// One `kiln train` of a tiny model with --metrics-port for the suite, in a tmux server of the
// suite's own, which also runs each test's `kiln top`; everything is killed with the server.
class TopTrainRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::tmux_available()) {
      reason_ = "tmux is not on PATH: run scripts/install-deps.sh (Debian's tmux package)";
      return;
    }
    dir_ = new testing::TempDir();
    tmux_ = new testing::TmuxServer();
    port_ = dist::find_free_port();
    tmux_->start(fmt::format(
        "OMP_NUM_THREADS=1 {} train --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
        "--seq-length 16 --vocab-size 64 --mock-data --micro-batch-size 2 --global-batch-size 4 "
        "--num-workers 0 --log-interval 100000 --train-iters {} --metrics-port {} > {} 2>&1",
        testing::kiln_binary(), kLongRun, port_, testing::shell_quoted(*dir_ / "train.log")));
    const bool serving = eventually(30, [] {
      const std::vector<MetricsScrape> scrape = scrape_metrics({{"127.0.0.1", port_}});
      return read_run(scrape[0].samples).iteration.has_value();
    });
    if (!serving)
      reason_ = "`kiln train --metrics-port` did not serve its iterations: " +
                testing::read_file_bytes(*dir_ / "train.log");
  }
  static void TearDownTestSuite() {
    delete tmux_;
    delete dir_;
  }
  void SetUp() override {
    if (!reason_.empty()) GTEST_FAIL() << reason_;
  }

  // `kiln top` following the run in a new pane of 120 x 60 (room for the run below a node's
  // GPUs). When it ends, the pane's shell writes its exit status and `stty -a` into `status` and
  // sleeps, keeping the pane and its terminal as kiln top left them for the test to ask tmux about.
  static std::string start_top(const std::string& status) {
    return tmux_->start(
        fmt::format("{} top --metrics 127.0.0.1:{} --interval 0.2; echo \"exit $?\" > {}.part; "
                    "stty -a >> {}.part; mv {}.part {}; exec sleep 600",
                    testing::kiln_binary(), port_, status, status, status, status),
        120, 60);
  }

  // The screen once it shows the run's iteration, or "" after 20 s.
  static std::string frame_of_the_run(const std::string& pane) {
    std::string screen;
    eventually(20, [&] {
      screen = tmux_->capture(pane);
      return shown_iteration(screen) >= 0;
    });
    return shown_iteration(screen) >= 0 ? screen : "";
  }

  // Whether kiln top ended within `seconds`: the status file is there.
  static bool ended(const std::string& status, double seconds) {
    return eventually(seconds, [&] { return ::access(status.c_str(), F_OK) == 0; });
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline testing::TmuxServer* tmux_ = nullptr;
  static inline int port_ = 0;
  static inline std::string reason_;
};

TEST_F(TopTrainRun, OncePrintsOneFrameOfTheRun) {
  const testing::CommandResult top =
      testing::run_kiln(fmt::format("top --once --metrics {}", port_));
  std::cout << "kiln top --once --metrics " << port_ << ":\n" << top.output;
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_NE(top.output.find(expected_gpu_line()), std::string::npos) << top.output;
  EXPECT_NE(top.output.find(fmt::format("\nrun 127.0.0.1:{}  rank 0  host ", port_)),
            std::string::npos)
      << top.output;
  EXPECT_GT(shown_iteration(top.output), 0) << top.output;
  EXPECT_TRUE(std::regex_search(top.output, std::regex(R"(\n  loss \d+\.\d{4}  )"))) << top.output;
  EXPECT_TRUE(std::regex_search(top.output, std::regex(R"(ETA (\d+[smhd] ?)+)"))) << top.output;
}

// The live view: a frame of the run, refreshed in place (the iteration advances on the same
// screen), redrawn for a new size, and q ends it at once with status 0, the terminal as it was.
TEST_F(TopTrainRun, TheLiveViewRefreshesInPlaceAndQQuits) {
  const std::string status = *dir_ / "q.status";
  const std::string pane = start_top(status);
  const std::string first = frame_of_the_run(pane);
  ASSERT_NE(first, "") << "no frame of the run within 20 s:\n" << tmux_->capture(pane);
  std::cout << "kiln top under tmux, 120 x 60:\n" << first;
  EXPECT_TRUE(first.starts_with("kiln top  ")) << first;
  EXPECT_NE(first.find(expected_gpu_line()), std::string::npos) << first;
  EXPECT_TRUE(std::regex_search(first, std::regex(R"(\n  loss \d+\.\d{4}  )"))) << first;
  EXPECT_EQ(tmux_->query(pane, "#{alternate_on} #{cursor_flag}"), "1 0");  // its own screen
  std::string later;
  EXPECT_TRUE(eventually(10,
                         [&] {
                           later = tmux_->capture(pane);
                           return shown_iteration(later) > shown_iteration(first);
                         }))
      << "the iteration did not advance:\n"
      << later;
  EXPECT_TRUE(later.starts_with("kiln top  ")) << later;  // the same place, not scrolled

  tmux_->resize(pane, 60, 60);
  std::string narrow;
  EXPECT_TRUE(eventually(5, [&] {
    narrow = tmux_->capture(pane);
    // Redrawn for 60 columns: the progress line ends with its ETA instead of being cut.
    const size_t progress = narrow.find("\n  iteration");
    return progress != std::string::npos &&
           narrow.find("ETA", progress) < narrow.find('\n', progress + 1);
  })) << narrow;

  tmux_->resize(pane, 60, 5);  // shorter than the frame: cut, with a count, not scrolled
  std::string short_screen;
  EXPECT_TRUE(eventually(5, [&] {
    short_screen = tmux_->capture(pane);
    return short_screen.starts_with("kiln top  ") &&
           std::regex_search(short_screen, std::regex(R"(\n\(\d+ more lines\)\n$)"));
  })) << short_screen;

  const auto sent = Clock::now();
  tmux_->send_keys(pane, "q");
  ASSERT_TRUE(ended(status, 5)) << tmux_->capture(pane);
  const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
  std::cout << "q ended kiln top in " << seconds << " s\n";
  EXPECT_LT(seconds, 2);
  const std::string after = testing::read_file_bytes(status);
  EXPECT_TRUE(after.starts_with("exit 0\n")) << after;
  EXPECT_TRUE(restored_mode(after)) << after;
  EXPECT_EQ(tmux_->query(pane, "#{alternate_on} #{cursor_flag}"), "0 1");
  EXPECT_EQ(tmux_->capture(pane).find("kiln top"), std::string::npos);  // the shell's screen back
}

TEST_F(TopTrainRun, CtrlCQuitsToo) {
  const std::string status = *dir_ / "ctrl-c.status";
  const std::string pane = start_top(status);
  ASSERT_NE(frame_of_the_run(pane), "") << tmux_->capture(pane);
  tmux_->send_keys(pane, "C-c");
  ASSERT_TRUE(ended(status, 5)) << tmux_->capture(pane);
  const std::string after = testing::read_file_bytes(status);
  EXPECT_TRUE(after.starts_with("exit 0\n")) << after;
  EXPECT_TRUE(restored_mode(after)) << after;
}

// A SIGTERM from elsewhere: the terminal is restored, then kiln top dies of the signal.
TEST_F(TopTrainRun, ASigtermRestoresTheTerminalThenEndsTop) {
  const std::string status = *dir_ / "sigterm.status";
  const std::string pane = start_top(status);
  ASSERT_NE(frame_of_the_run(pane), "") << tmux_->capture(pane);
  const std::string shell = tmux_->query(pane, "#{pane_pid}");
  const std::string children =
      testing::read_file_bytes("/proc/" + shell + "/task/" + shell + "/children");
  const pid_t top = static_cast<pid_t>(std::atoi(children.c_str()));
  ASSERT_GT(top, 0) << "the pane's shell has no child: '" << children << "'";
  ASSERT_EQ(::kill(top, SIGTERM), 0);
  ASSERT_TRUE(ended(status, 5)) << tmux_->capture(pane);
  const std::string after = testing::read_file_bytes(status);
  EXPECT_TRUE(after.starts_with(fmt::format("exit {}\n", 128 + SIGTERM))) << after;
  EXPECT_TRUE(restored_mode(after)) << after;
  EXPECT_EQ(tmux_->query(pane, "#{alternate_on} #{cursor_flag}"), "0 1");
}

}  // namespace
}  // namespace kiln
