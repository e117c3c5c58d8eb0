// `kiln top`: a live view of this machine's GPUs (NVML) and of training runs (their /metrics
// pages, --metrics), refreshed in place every --interval seconds until q or Ctrl-C; --once prints
// one frame for scripts. docs/top.md shows it.
//
// The live view needs a terminal on standard input and output and says so otherwise (--once works
// anywhere). Exit status: 0 after q or Ctrl-C; killed by the signal after SIGINT, SIGTERM or
// SIGHUP from elsewhere (the terminal restored first); with --once, 1 when a run's page could not
// be read (the frame still printed, with the reason).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/obs/metrics_scrape.h"
#include "kiln/obs/top_frame.h"
#include "kiln/obs/top_reader.h"
#include "kiln/obs/top_terminal.h"

namespace kiln::cli {
namespace {

constexpr int kDefaultOnceWidth = 100;  // standard output not a terminal, no $COLUMNS
constexpr double kMinInterval = 0.1, kMaxInterval = 3600;

struct TopOptions {
  std::vector<std::string> metrics;
  double interval = 1;
  bool once = false;
};

std::vector<MetricsEndpoint> endpoints(const std::vector<std::string>& texts) {
  std::vector<MetricsEndpoint> endpoints;
  for (const std::string& text : texts) {
    try {
      endpoints.push_back(parse_metrics_endpoint(text));
    } catch (const Error& error) {
      fail("--metrics: {}", error.what());
    }
  }
  return endpoints;
}

std::string local_time(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  ::localtime_r(&now, &parts);
  char text[64] = {};
  std::strftime(text, sizeof(text), format, &parts);
  return text;
}

// The terminal's width when standard output is one, else $COLUMNS (which watch sets), else 100.
int once_width() {
  if (::isatty(STDOUT_FILENO)) return TopTerminal::columns();
  const char* columns = std::getenv("COLUMNS");
  const int parsed = columns ? std::atoi(columns) : 0;
  return parsed > 0 ? parsed : kDefaultOnceWidth;
}

void print_once(TopReader& reader) {
  const TopFrame frame = reader.read("kiln top  " + local_time("%Y-%m-%d %H:%M:%S"));
  std::fputs(render_top_frame(frame, once_width()).c_str(), stdout);
  std::fflush(stdout);
  const bool unread = std::any_of(frame.runs.begin(), frame.runs.end(),
                                  [](const TopRun& run) { return !run.error.empty(); });
  if (unread) throw CLI::RuntimeError(1);  // exit 1, the frame having said why
}

// The live view until a key quits (0) or a signal stops it (the signal's number).
int show_live(TopReader& reader, double interval) {
  TopTerminal terminal;
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(interval));
  while (true) {
    const auto deadline = std::chrono::steady_clock::now() + period;
    const TopFrame frame = reader.read(
        fmt::format("kiln top  {}  every {:g} s, q quits", local_time("%H:%M:%S"), interval));
    while (true) {  // a new size redraws the same readings until the deadline
      terminal.show(fit_to_height(render_top_frame(frame, terminal.columns()), terminal.rows()));
      const TopTerminal::Wake wake = terminal.wait_until(deadline);
      if (wake.why == TopTerminal::Wake::Why::quit) return 0;
      if (wake.why == TopTerminal::Wake::Why::signal) return wake.signal;
      if (wake.why == TopTerminal::Wake::Why::deadline) break;
    }
  }
}

void top(const TopOptions& options) {
  KILN_CHECK(options.interval >= kMinInterval && options.interval <= kMaxInterval,
             "--interval must be in [{}, {}] seconds, got {}", kMinInterval, kMaxInterval,
             options.interval);
  TopReader reader(endpoints(options.metrics));
  if (options.once) {
    print_once(reader);
    return;
  }
  if (const int signal = show_live(reader, options.interval); signal != 0) {
    std::signal(signal, SIG_DFL);  // the terminal is restored: now die of it, as the sender meant
    std::raise(signal);
    throw CLI::RuntimeError(128 + signal);  // the shell's status for it, should raise() return
  }
}

}  // namespace

void add_top_command(CLI::App& root) {
  auto options = std::make_shared<TopOptions>();
  CLI::App* command = root.add_subcommand(
      "top",
      "watch this machine's GPUs and training runs, refreshed in place (q quits): kiln top "
      "[--metrics HOST:PORT]... [--interval SECONDS] [--once]");
  command->add_option("--metrics", options->metrics,
                      "a run's metrics endpoint (kiln train --metrics-port): PORT on 127.0.0.1, "
                      "HOST:PORT, [IPV6]:PORT or http://HOST:PORT/metrics; once per rank");
  command->add_option("--interval", options->interval, "seconds between refreshes");
  command->add_flag("--once", options->once, "print one frame and exit (for scripts)");
  command->callback([options] { top(*options); });
}

}  // namespace kiln::cli
