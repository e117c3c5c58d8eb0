// The Prometheus endpoint: the registry's exposition text (exact), what the observer makes of the
// Trainer's events, the server's answers, a port in use (in the process and through `kiln train`),
// CUDA_VISIBLE_DEVICES and NVML's loading, and a `kiln train` run scraped for real: `promtool check
// metrics` on its text, and a Prometheus server started here on loopback that scrapes it and
// answers a query through its HTTP API. Tests that need Debian's prometheus package skip without
// it.
#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/dist/worker_group.h"
#include "kiln/obs/nvml_library.h"
#include "kiln/obs/prometheus_observer.h"
#include "kiln/obs/prometheus_registry.h"
#include "kiln/obs/prometheus_server.h"
#include "kiln/train/config.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"

extern char** environ;

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

struct HttpAnswer {
  long status = 0;  // 0: no answer
  std::string body, content_type;
};

HttpAnswer http_request(const std::string& url, const char* method = "GET") {
  HttpAnswer answer;
  const std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(),
                                                                 &curl_easy_cleanup);
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  if (std::string_view(method) == "HEAD")
    curl_easy_setopt(curl.get(), CURLOPT_NOBODY, 1L);  // curl then expects no body
  else
    curl_easy_setopt(curl.get(), CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(
      curl.get(), CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* body) {
        static_cast<std::string*>(body)->append(data, size * count);
        return size * count;
      });
  if (curl_easy_perform(curl.get()) != CURLE_OK) return answer;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &answer.status);
  char* type = nullptr;
  curl_easy_getinfo(curl.get(), CURLINFO_CONTENT_TYPE, &type);
  if (type != nullptr) answer.content_type = type;
  return answer;
}

// The value of the exposition line that starts with `series` (name and labels, as rendered).
std::optional<double> sample_value(const std::string& text, const std::string& series) {
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return std::nullopt;
}

// An executable of that name on PATH, or "".
std::string executable_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "";
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string candidate = std::string(rest.substr(0, colon)) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    rest = colon == std::string_view::npos ? "" : rest.substr(colon + 1);
  }
  return "";
}

// A program started in its own process group, stdout and stderr into `log`, with OMP_NUM_THREADS=1
// (two shared cores); everything the child needs is built before the fork. Stopped (SIGTERM to the
// group, then waited for) on destruction.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<std::string> env{"OMP_NUM_THREADS=1"};
    for (char** entry = environ; *entry != nullptr; ++entry)
      if (!std::string_view(*entry).starts_with("OMP_NUM_THREADS=")) env.emplace_back(*entry);
    std::vector<char*> args, envp;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    for (const std::string& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
    args.push_back(nullptr);
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
  }
  ~Subprocess() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  bool running() {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
    return pid_ > 0;
  }

 private:
  pid_t pid_ = -1;
};

// ---- the registry
// ---------------------------------------------------------------------------------

TEST(PrometheusRegistry, RendersTheTextFormatExactly) {
  PrometheusRegistry registry({{"rank", "0"}, {"host", "node \"a\"\\b"}});
  const auto steps =
      registry.add_counter("demo_steps_total", "Steps done.\nA second line, a \\ backslash.");
  const auto temperature = registry.add_gauge("demo_temperature_celsius", "A gauge.");
  registry.add_gauge("demo_never_set", "Rendered only once it has a value.");
  const auto duration = registry.add_histogram("demo_duration_seconds", "A histogram.", {0.25, 1});
  registry.increment(steps, 2);
  registry.increment(steps, 3);
  registry.set(temperature, 41.5, {{"gpu", "1"}});
  registry.set(temperature, -3, {{"gpu", "0"}});
  registry.set(temperature, INFINITY, {{"gpu", "2"}});
  registry.observe(duration, 0.125);
  registry.observe(duration, 0.25);  // a bucket's bound is inclusive
  registry.observe(duration, 4);
  const std::string labels = R"(rank="0",host="node \"a\"\\b")";
  EXPECT_EQ(registry.render(),
            fmt::format("# HELP demo_steps_total Steps done.\\nA second line, a \\\\ backslash.\n"
                        "# TYPE demo_steps_total counter\n"
                        "demo_steps_total{{{0}}} 5\n"
                        "# HELP demo_temperature_celsius A gauge.\n"
                        "# TYPE demo_temperature_celsius gauge\n"
                        "demo_temperature_celsius{{{0},gpu=\"0\"}} -3\n"
                        "demo_temperature_celsius{{{0},gpu=\"1\"}} 41.5\n"
                        "demo_temperature_celsius{{{0},gpu=\"2\"}} +Inf\n"
                        "# HELP demo_duration_seconds A histogram.\n"
                        "# TYPE demo_duration_seconds histogram\n"
                        "demo_duration_seconds_bucket{{{0},le=\"0.25\"}} 2\n"
                        "demo_duration_seconds_bucket{{{0},le=\"1\"}} 2\n"
                        "demo_duration_seconds_bucket{{{0},le=\"+Inf\"}} 3\n"
                        "demo_duration_seconds_sum{{{0}}} 4.375\n"
                        "demo_duration_seconds_count{{{0}}} 3\n",
                        labels));
}

TEST(PrometheusRegistry, RefusesWhatPrometheusWouldNot) {
  PrometheusRegistry registry;
  EXPECT_EQ(error_of([&] { registry.add_counter("demo_steps", "x"); }),
            "Prometheus counter 'demo_steps' must end in _total");
  EXPECT_EQ(error_of([&] { registry.add_gauge("2fast", "x"); }),
            "Prometheus metric name '2fast' is not valid");
  EXPECT_EQ(error_of([&] {
              registry.add_histogram("demo_seconds", "x", {1, 0.5});
            }),
            "Prometheus histogram 'demo_seconds': bucket bounds must be finite and increasing");
  const auto gauge = registry.add_gauge("demo_ratio", "x");
  EXPECT_EQ(error_of([&] { registry.add_gauge("demo_ratio", "x"); }),
            "Prometheus metric 'demo_ratio' is added twice");
  EXPECT_EQ(error_of([&] { registry.observe(gauge, 1); }),
            "Prometheus metric 'demo_ratio' is a gauge, not a histogram");
  EXPECT_EQ(error_of([&] {
              registry.set(gauge, 1, {{"le", "1"}});
            }),
            "Prometheus metric 'demo_ratio': label name 'le' is not valid");
  const auto counter = registry.add_counter("demo_total", "x");
  EXPECT_EQ(error_of([&] { registry.increment(counter, -1); }),
            "Prometheus counter 'demo_total' cannot decrease (by -1)");
  EXPECT_EQ(registry.render(), "");  // nothing refused was recorded
}

// ---- the observer
// ---------------------------------------------------------------------------------

IterationStats iteration(int64_t number, double elapsed_ms) {
  IterationStats stats;
  stats.iteration = number;
  stats.train_iters = 10;
  stats.consumed_samples = 4 * number;
  stats.elapsed_ms = elapsed_ms;
  stats.data_wait_ms = 5;
  stats.grad_reduce_wait_ms = 2;
  stats.tflops_per_gpu = 1.5;
  stats.tokens_per_second = 768;
  stats.learning_rate = 3e-4;
  stats.lm_loss = 2.5 + static_cast<double>(number);
  stats.loss_scale = 65536;
  stats.grad_norm = 0.75;
  stats.skipped_iterations = 1;
  return stats;
}

TEST(PrometheusObserver, IterationsAndValidationsBecomeMetricsInBaseUnits) {
  PrometheusRegistry registry({{"rank", "1"}, {"host", "h"}});
  PrometheusObserver observer(registry, {.seq_length = 16, .peak_flops_per_second = 1e13});
  observer.on_iteration(iteration(3, 300));
  observer.on_iteration(iteration(4, 40));
  observer.on_validation(
      {.iteration = 4, .lm_loss = 3.25, .perplexity = std::exp(3.25), .at_end = false, .classification = {}});
  const std::string text = registry.render();
  auto value = [&](const std::string& series) {
    const std::optional<double> found = sample_value(
        text, series + R"({rank="1",host="h")" + (series.ends_with("_bucket") ? "" : "}"));
    return found.value_or(NAN);
  };
  EXPECT_EQ(value("kiln_iterations_total"), 4);
  EXPECT_EQ(value("kiln_train_iterations"), 10);
  EXPECT_EQ(value("kiln_consumed_samples_total"), 16);
  EXPECT_EQ(value("kiln_consumed_tokens_total"), 16 * 16);
  EXPECT_EQ(value("kiln_skipped_iterations_total"), 1);
  EXPECT_EQ(value("kiln_lm_loss"), 6.5);
  EXPECT_EQ(value("kiln_learning_rate"), 3e-4);
  EXPECT_EQ(value("kiln_loss_scale"), 65536);
  EXPECT_EQ(value("kiln_gradient_norm"), 0.75);
  EXPECT_EQ(value("kiln_tokens_per_second"), 768);
  EXPECT_EQ(value("kiln_model_flops_per_second"), 1.5e12);
  EXPECT_DOUBLE_EQ(value("kiln_model_flops_utilization_ratio"), 0.15);
  EXPECT_DOUBLE_EQ(value("kiln_data_wait_seconds_total"), 0.010);
  EXPECT_DOUBLE_EQ(value("kiln_gradient_reduce_wait_seconds_total"), 0.004);
  EXPECT_EQ(value("kiln_validation_lm_loss"), 3.25);
  EXPECT_EQ(
      sample_value(text, R"(kiln_iteration_duration_seconds_bucket{rank="1",host="h",le="0.025"})"),
      0);
  EXPECT_EQ(
      sample_value(text, R"(kiln_iteration_duration_seconds_bucket{rank="1",host="h",le="0.05"})"),
      1);
  EXPECT_EQ(
      sample_value(text, R"(kiln_iteration_duration_seconds_bucket{rank="1",host="h",le="0.25"})"),
      1);
  EXPECT_EQ(
      sample_value(text, R"(kiln_iteration_duration_seconds_bucket{rank="1",host="h",le="0.5"})"),
      2);
  EXPECT_EQ(
      sample_value(text, R"(kiln_iteration_duration_seconds_bucket{rank="1",host="h",le="+Inf"})"),
      2);
  EXPECT_DOUBLE_EQ(value("kiln_iteration_duration_seconds_sum"), 0.34);
  EXPECT_EQ(value("kiln_iteration_duration_seconds_count"), 2);
}

TEST(PrometheusObserver, NoUtilizationWithoutTheGpusPeak) {
  PrometheusRegistry registry;
  PrometheusObserver observer(registry, {.seq_length = 16, .peak_flops_per_second = 0});
  observer.on_iteration(iteration(1, 10));
  const std::string text = registry.render();
  EXPECT_NE(text.find("kiln_model_flops_per_second 1500000000000\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("kiln_model_flops_utilization_ratio"), std::string::npos) << text;
  EXPECT_EQ(text.find("kiln_validation_lm_loss"), std::string::npos) << text;  // no validation yet
}

// ---- the server
// -----------------------------------------------------------------------------------

TEST(PrometheusServer, AnswersGetMetricsAndNothingElse) {
  PrometheusServer server("127.0.0.1", 0, [] { return std::string("demo_up 1\n"); });
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), fmt::format("http://127.0.0.1:{}/metrics", server.port()));
  const HttpAnswer metrics = http_request(server.url());
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.body, "demo_up 1\n");
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(http_request(server.url(), "HEAD").status, 200);
  EXPECT_EQ(http_request(fmt::format("http://127.0.0.1:{}/", server.port())).status, 404);
  EXPECT_EQ(http_request(server.url(), "POST").status, 405);
}

TEST(PrometheusServer, AFailingRenderAnswers500WithItsReason) {
  PrometheusServer server("127.0.0.1", 0,
                          []() -> std::string { throw Error("the registry is on fire"); });
  const HttpAnswer answer = http_request(server.url());
  EXPECT_EQ(answer.status, 500);
  EXPECT_EQ(answer.body, "kiln could not render its metrics: the registry is on fire\n");
}

TEST(PrometheusServer, APortInUseOrAForeignAddressIsAnErrorNamingIt) {
  PrometheusServer first("127.0.0.1", 0, [] { return std::string(); });
  EXPECT_EQ(
      error_of([&] { PrometheusServer("127.0.0.1", first.port(), [] { return std::string(); }); }),
      fmt::format("Prometheus endpoint: cannot listen on 127.0.0.1:{}: Address already in use "
                  "(another process "
                  "has the port; each rank serves --metrics-port + its local rank)",
                  first.port()));
  // 192.0.2.1 is TEST-NET-1 (RFC 5737), an address of no host here.
  EXPECT_EQ(
      error_of([] { PrometheusServer("192.0.2.1", 9400, [] { return std::string(); }); }),
      "Prometheus endpoint: cannot listen on 192.0.2.1:9400: Cannot assign requested address");
  EXPECT_EQ(error_of([] { PrometheusServer("127.0.0.1", 70000, [] { return std::string(); }); }),
            "Prometheus endpoint: port 70000 is not in [0, 65535]");
}

// `kiln train` with --metrics-port on a port in use stops before its first step, naming the port.
TEST(PrometheusTrain, APortInUseStopsTheRunBeforeItsFirstStep) {
  PrometheusServer occupant("127.0.0.1", 0, [] { return std::string(); });
  const testing::CommandResult run =
      testing::run_kiln(fmt::format("train --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
                                    "--seq-length 16 --vocab-size 64 --mock-data "
                                    "--micro-batch-size 2 --global-batch-size 4 --num-workers 0 "
                                    "--train-iters 2 --log-interval 1 --metrics-port {}",
                                    occupant.port()));
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(fmt::format("cannot listen on 127.0.0.1:{}: Address already in use",
                                        occupant.port())),
            std::string::npos)
      << run.output;
  EXPECT_FALSE(std::regex_search(run.output, std::regex(R"(iteration\s+1/)"))) << run.output;
}

TEST(PrometheusConfig, OffByDefaultAndThePortIsAPort) {
  Config config;
  EXPECT_EQ(config.metrics_port, 0);
  EXPECT_EQ(config.metrics_addr, "127.0.0.1");
  apply_yaml(config, "metrics_port: 9400\nmetrics_addr: 0.0.0.0\n", "run.yaml");
  config.resolve();
  EXPECT_EQ(error_of([&] { config.validate(); }), "");
  EXPECT_NE(to_yaml(config).find("metrics_port: 9400"), std::string::npos);
  config.metrics_port = 65536;
  EXPECT_EQ(error_of([&] { config.validate(); }),
            "config key 'metrics_port' must be in [0, 65535], got 65536");
  config.metrics_port = 9400;
  config.metrics_addr = "";
  EXPECT_EQ(error_of([&] { config.validate(); }),
            "config key 'metrics_addr' is empty; give an address such as 127.0.0.1");
}

// ---- the rank's GPU
// -------------------------------------------------------------------------------

TEST(PrometheusGpu, TheRanksEntryOfCudaVisibleDevices) {
  EXPECT_EQ(visible_device_entry(nullptr, 1), "1");
  EXPECT_EQ(visible_device_entry("2,3", 1), "3");
  EXPECT_EQ(visible_device_entry("GPU-8f1e2a,1", 0), "GPU-8f1e2a");
  EXPECT_EQ(visible_device_entry("0,bad,2", 2),
            std::nullopt);  // CUDA stops at the first invalid entry
  EXPECT_EQ(visible_device_entry("0", 1), std::nullopt);
  EXPECT_EQ(visible_device_entry("", 0), std::nullopt);
  EXPECT_EQ(visible_device_entry(nullptr, -1), std::nullopt);
}

// Without NVIDIA's driver NVML does not load and says why; with it, GPU 0 reads as a GPU does.
TEST(PrometheusGpu, NvmlLoadsWhereTheDriverIsAndSaysWhyNotElsewhere) {
  std::string why_not;
  const std::unique_ptr<NvmlLibrary> nvml = NvmlLibrary::load(why_not);
  if (!nvml) {
    EXPECT_NE(why_not.find("NVML is not loaded"), std::string::npos) << why_not;
    GTEST_SKIP() << why_not;
  }
  const std::optional<unsigned> gpu = nvml->device_index("0", why_not);
  ASSERT_EQ(gpu, 0u) << why_not;
  const GpuReading reading = nvml->read(*gpu);
  ASSERT_TRUE(reading.memory_total_bytes && reading.memory_used_bytes);
  EXPECT_GT(*reading.memory_total_bytes, 1e9);
  EXPECT_LE(*reading.memory_used_bytes, *reading.memory_total_bytes);
  ASSERT_TRUE(reading.sm_clock_hertz && reading.temperature_celsius && reading.utilization_ratio);
  EXPECT_GT(*reading.sm_clock_hertz, 1e8);
  EXPECT_GT(*reading.temperature_celsius, 0);
  EXPECT_LE(*reading.utilization_ratio, 1);
}

// ---- a training run, scraped
// ----------------------------------------------------------------------

constexpr int64_t kLongRun = 1'000'000;  // iterations: far more than the tests take to scrape

// One `kiln train` of a tiny model with --metrics-port for the suite, running until the suite ends;
// its tests skip with the reason when it does not serve.
class PrometheusTrainRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    port_ = dist::find_free_port();
    run_ = new Subprocess({testing::kiln_binary(),
                           "train",
                           "--num-layers",
                           "1",
                           "--hidden-size",
                           "16",
                           "--num-attention-heads",
                           "2",
                           "--seq-length",
                           "16",
                           "--vocab-size",
                           "64",
                           "--mock-data",
                           "--micro-batch-size",
                           "2",
                           "--global-batch-size",
                           "4",
                           "--num-workers",
                           "0",
                           "--eval-interval",
                           "20",
                           "--eval-iters",
                           "1",
                           "--log-interval",
                           "100000",
                           "--train-iters",
                           std::to_string(kLongRun),
                           "--metrics-port",
                           std::to_string(port_)},
                          *dir_ / "kiln.log");
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (http_request(url()).body.find("kiln_validation_lm_loss") == std::string::npos) {
      if (!run_->running() || Clock::now() > deadline) {
        reason_ = "`kiln train --metrics-port` did not serve a validation's metrics: " +
                  testing::read_file_bytes(*dir_ / "kiln.log");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  static void TearDownTestSuite() {
    delete run_;
    delete dir_;
  }
  void SetUp() override {
    if (!reason_.empty()) GTEST_FAIL() << reason_;
  }
  static std::string url() { return fmt::format("http://127.0.0.1:{}/metrics", port_); }

  static inline TempDir* dir_ = nullptr;
  static inline Subprocess* run_ = nullptr;
  static inline int port_ = 0;
  static inline std::string reason_;
};

TEST_F(PrometheusTrainRun, PromtoolChecksTheScrapedText) {
  const std::string promtool = executable_on_path("promtool");
  if (promtool.empty())
    GTEST_SKIP()
        << "promtool is not on PATH (Debian's prometheus package; scripts/install-deps.sh)";
  const HttpAnswer scrape = http_request(url());
  ASSERT_EQ(scrape.status, 200);
  for (const char* name :
       {"kiln_iterations_total", "kiln_consumed_tokens_total", "kiln_lm_loss", "kiln_learning_rate",
        "kiln_tokens_per_second", "kiln_data_wait_seconds_total",
        "kiln_iteration_duration_seconds_bucket", "kiln_validation_lm_loss"})
    EXPECT_NE(scrape.body.find(std::string(name) + "{rank=\"0\",host=\""), std::string::npos)
        << name;
  testing::write_file_bytes(*dir_ / "scrape.txt", scrape.body);
  const testing::CommandResult check =
      testing::run_command(promtool + " check metrics < " + *dir_ / "scrape.txt");
  std::cout << "promtool check metrics on a scrape of `kiln train`: exit " << check.exit_code
            << ", output '" << check.output << "'\n";
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(check.output, "");  // no lint problem either
}

// A Prometheus server on a free loopback port scrapes the run every 0.5 s; its query API then
// answers kiln_iterations_total with the run's labels and a value it served.
TEST_F(PrometheusTrainRun, ARealPrometheusScrapesTheRunAndAnswersAQuery) {
  const std::string prometheus = executable_on_path("prometheus");
  if (prometheus.empty())
    GTEST_SKIP()
        << "prometheus is not on PATH (Debian's prometheus package; scripts/install-deps.sh)";
  const TempDir home;
  const int web_port = dist::find_free_port();
  testing::write_file_bytes(home / "prometheus.yml",
                            fmt::format("global:\n"
                                        "  scrape_interval: 500ms\n"
                                        "  scrape_timeout: 400ms\n"
                                        "scrape_configs:\n"
                                        "  - job_name: kiln\n"
                                        "    static_configs:\n"
                                        "      - targets: ['127.0.0.1:{}']\n",
                                        port_));
  Subprocess server(
      {prometheus, "--config.file=" + home / "prometheus.yml",
       "--storage.tsdb.path=" + home / "data",
       fmt::format("--web.listen-address=127.0.0.1:{}", web_port), "--log.level=warn"},
      home / "prometheus.log");
  const std::string api =
      fmt::format("http://127.0.0.1:{}/api/v1/query?query=kiln_iterations_total", web_port);
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  nlohmann::json result = nlohmann::json::array();
  while (result.empty()) {
    if (!server.running())
      GTEST_SKIP() << "prometheus did not start: "
                   << testing::read_file_bytes(home / "prometheus.log");
    ASSERT_LT(Clock::now(), deadline) << "no scrape answered within 15 s; prometheus said:\n"
                                      << testing::read_file_bytes(home / "prometheus.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const HttpAnswer answer = http_request(api);
    if (answer.status == 200) result = nlohmann::json::parse(answer.body).at("data").at("result");
  }
  ASSERT_EQ(result.size(), 1u) << result.dump();
  const nlohmann::json& metric = result[0].at("metric");
  EXPECT_EQ(metric.at("job"), "kiln");
  EXPECT_EQ(metric.at("instance"), fmt::format("127.0.0.1:{}", port_));
  EXPECT_EQ(metric.at("rank"), "0");
  const double scraped = std::stod(result[0].at("value").at(1).get<std::string>());
  const std::optional<double> now =
      sample_value(http_request(url()).body, "kiln_iterations_total{rank=\"0\",host=\"" +
                                                 metric.at("host").get<std::string>() + "\"}");
  std::cout << "Prometheus answered kiln_iterations_total = " << scraped << "; the run is at "
            << now.value_or(NAN) << "\n";
  EXPECT_GT(scraped, 0);
  ASSERT_TRUE(now);
  EXPECT_LE(scraped, *now);  // a counter the run had served
  EXPECT_LE(*now, kLongRun);
}

}  // namespace
}  // namespace kiln
