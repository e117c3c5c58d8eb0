#include "kiln/obs/top_frame.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln {
namespace {

constexpr int kMinBarWidth = 10, kMaxBarWidth = 60;
constexpr double kMiB = 1 << 20, kGiB = 1 << 30;

// The frame's lines, each made printable and cut to the width when the text is taken.
class Lines {
 public:
  explicit Lines(int width) : width_(width) {}

  void add(std::string line) { lines_.push_back(std::move(line)); }

  // `items` separated by `separator`, after `first_indent` on the first line and `next_indent` on
  // the lines the width makes them wrap onto; an item is never split (only cut when it alone is
  // wider than a line).
  void add_wrapped(const std::vector<std::string>& items, std::string_view first_indent,
                   std::string_view next_indent, std::string_view separator = "  ") {
    std::string line(first_indent);
    bool line_has_item = false;
    for (const std::string& item : items) {
      if (line_has_item &&
          columns(line) + separator.size() + columns(item) > static_cast<size_t>(width_)) {
        add(std::move(line));
        line = std::string(next_indent);
        line_has_item = false;
      }
      if (line_has_item) line += separator;
      line += item;
      line_has_item = true;
    }
    add(std::move(line));
  }

  std::string text() const {
    std::string text;
    for (const std::string& line : lines_) text += shown(line) + '\n';
    return text;
  }

  int width() const { return width_; }

 private:
  // UTF-8 code points, as the columns a terminal gives them (wide characters aside).
  static size_t columns(std::string_view text) {
    return static_cast<size_t>(
        std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
  }

  // Control characters as '?', cut to the width at a character's start, no trailing blanks.
  std::string shown(std::string_view line) const {
    std::string out;
    int column = 0;
    for (char c : line) {
      const bool starts_character = (c & 0xC0) != 0x80;
      if (starts_character && ++column > width_) break;
      const auto byte = static_cast<unsigned char>(c);
      out += byte < 0x20 || byte == 0x7F ? '?' : c;
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }

  int width_;
  std::vector<std::string> lines_;
};

std::string bar(double fraction, int inner_width) {
  const double filled_fraction = std::isnan(fraction) ? 0 : std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::lround(filled_fraction * inner_width));
  return "[" + std::string(filled, '|') + std::string(inner_width - filled, ' ') + "]";
}

int bar_width(int width, size_t beside_it) {
  return std::clamp(width - static_cast<int>(beside_it) - 2, kMinBarWidth, kMaxBarWidth);
}

std::string bytes_text(double bytes) {
  return bytes >= kGiB ? fmt::format("{:.1f} GiB", bytes / kGiB)
                       : fmt::format("{:.0f} MiB", bytes / kMiB);
}

// 950, 12.3k, 1.23M, 4.56G: a rate at a glance.
std::string si_text(double value) {
  if (value < 1e3) return fmt::format("{:.0f}", value);
  if (value < 1e6) return fmt::format("{:.1f}k", value / 1e3);
  if (value < 1e9) return fmt::format("{:.2f}M", value / 1e6);
  return fmt::format("{:.2f}G", value / 1e9);
}

std::string step_text(double seconds) {
  return seconds < 1 ? fmt::format("{:.2f} ms", seconds * 1e3) : fmt::format("{:.2f} s", seconds);
}

// 45s, 12m 05s, 3h 04m, 2d 05h: the two largest units.
std::string duration_text(double seconds) {
  constexpr double kLongest = 1e12;   // seconds; past any run, and far inside a long long
  if (!(seconds >= 0)) return "n/a";  // NaN from a page's NaN
  const auto whole = static_cast<long long>(std::llround(std::min(seconds, kLongest)));
  if (whole < 60) return fmt::format("{}s", whole);
  if (whole < 3600) return fmt::format("{}m {:02}s", whole / 60, whole % 60);
  if (whole < 86400) return fmt::format("{}h {:02}m", whole / 3600, whole % 3600 / 60);
  return fmt::format("{}d {:02}h", whole / 86400, whole % 86400 / 3600);
}

template <typename Format>
std::string labelled(std::string_view label, const std::optional<double>& value, Format format) {
  return fmt::format("{} {}", label, value ? format(*value) : std::string("n/a"));
}

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> words;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find(' ', start), text.size());
    if (end > start) words.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

void render_gpu(const TopGpu& gpu, Lines& lines) {
  const GpuReading& reading = gpu.reading;
  const auto whole = [](std::string_view unit) {
    return [unit](double value) { return fmt::format("{:.0f} {}", value, unit); };
  };
  const auto megahertz = [](double hertz) { return fmt::format("{:.0f} MHz", hertz / 1e6); };
  lines.add_wrapped({fmt::format("GPU {}  {}", gpu.index, gpu.name.empty() ? "?" : gpu.name),
                     labelled("power", reading.power_watts, whole("W")),
                     labelled("temp", reading.temperature_celsius, whole("C")),
                     labelled("SM", reading.sm_clock_hertz, megahertz),
                     labelled("memory", reading.memory_clock_hertz, megahertz)},
                    "", "  ");
  // Both bars on one line where two of kMinBarWidth fit, else the memory's wraps onto the next.
  const std::string widest_memory = bytes_text(999 * kGiB) + " / " + bytes_text(999 * kGiB);
  const auto beside_bars =
      std::string_view("  util [] 100%  mem [] ").size() + widest_memory.size();
  const int inner =
      std::clamp((lines.width() - static_cast<int>(beside_bars)) / 2, kMinBarWidth, kMaxBarWidth);
  const std::optional<double>& used = reading.memory_used_bytes;
  const std::optional<double>& total = reading.memory_total_bytes;
  lines.add_wrapped(
      {reading.utilization_ratio
           ? fmt::format("util {} {:>3.0f}%", bar(*reading.utilization_ratio, inner),
                         *reading.utilization_ratio * 100)
           : fmt::format("{:<{}}", "util n/a", inner + 12),  // as wide: the memory bars align
       used && total && *total > 0 ? fmt::format("mem {} {} / {}", bar(*used / *total, inner),
                                                 bytes_text(*used), bytes_text(*total))
                                   : std::string("mem n/a")},
      "  ", "  ");
  if (!gpu.processes_unknown.empty())
    lines.add_wrapped(words("processes: " + gpu.processes_unknown), "  ", "    ", " ");
  else if (gpu.processes.empty())
    lines.add("  no processes");
  for (const TopProcess& process : gpu.processes)
    lines.add(fmt::format(
        "  pid {:>7}  {:<16} {:>10}", process.pid, process.name.empty() ? "?" : process.name,
        process.used_memory_bytes ? bytes_text(*process.used_memory_bytes) : std::string("n/a")));
}

void render_gpus(const TopGpus& top, Lines& lines) {
  if (top.gpus.empty()) lines.add_wrapped(words("no GPU: " + top.none_because), "", "  ", " ");
  for (const TopGpu& gpu : top.gpus) render_gpu(gpu, lines);
}

void render_progress(const RunReading& reading, const RunPace& pace, Lines& lines) {
  const std::string count = fmt::format("  iteration {:.0f}", *reading.iteration);
  if (!reading.train_iterations || *reading.train_iterations <= 0) {
    lines.add(count);
    return;
  }
  const double total = *reading.train_iterations;
  const double left = total - *reading.iteration;
  const std::string eta = left <= 0           ? std::string("done")
                          : pace.step_seconds ? duration_text(left * *pace.step_seconds)
                                              : std::string("n/a");
  const std::string head = fmt::format("{} / {:.0f} ", count, total);
  const std::string tail = fmt::format(" {:>5.1f}%  ETA {}", 100 * *reading.iteration / total, eta);
  const size_t widest_tail = std::string_view(" 100.0%  ETA 99d 23h").size();
  lines.add(head +
            bar(*reading.iteration / total, bar_width(lines.width(), head.size() + widest_tail)) +
            tail);
}

void render_run(const TopRun& run, Lines& lines) {
  const RunReading& reading = run.reading;
  std::vector<std::string> head{"run " + run.endpoint};
  if (!reading.rank.empty()) head.push_back("rank " + reading.rank);
  if (!reading.host.empty()) head.push_back("host " + reading.host);
  lines.add_wrapped(head, "", "  ");
  if (!run.error.empty()) {
    lines.add_wrapped(words(run.error), "  ", "    ", " ");
    return;
  }
  if (!reading.iteration) {
    lines.add_wrapped(words("no kiln_iterations_total yet: the run has not finished an iteration, "
                            "or this is not a kiln run's page"),
                      "  ", "    ", " ");
    return;
  }
  render_progress(reading, run.pace, lines);
  const auto fixed = [](const char* format) {
    return [format](double value) { return fmt::format(fmt::runtime(format), value); };
  };
  const auto percent = [](double ratio) { return fmt::format("{:.1f}%", ratio * 100); };
  std::vector<std::string> items{labelled("loss", reading.lm_loss, fixed("{:.4f}"))};
  if (reading.validation_lm_loss)
    items.push_back(labelled("val loss", reading.validation_lm_loss, fixed("{:.4f}")));
  items.push_back(labelled("lr", reading.learning_rate, fixed("{:.2e}")));
  items.push_back(labelled("tokens/s", reading.tokens_per_second, si_text));
  items.push_back(labelled("step", run.pace.step_seconds, step_text));
  if (reading.model_flops_utilization)
    items.push_back(labelled("MFU", reading.model_flops_utilization, percent));
  if (run.pace.data_wait_fraction)
    items.push_back(labelled("data wait", run.pace.data_wait_fraction, percent));
  if (reading.skipped_iterations.value_or(0) > 0)
    items.push_back(labelled("skipped", reading.skipped_iterations, fixed("{:.0f}")));
  lines.add_wrapped(items, "  ", "  ");
}

}  // namespace

std::string render_top_frame(const TopFrame& frame, int width) {
  Lines lines(std::max(width, kMinTopWidth));
  lines.add(frame.title);
  lines.add("");
  render_gpus(frame.gpus, lines);
  lines.add("");
  if (frame.runs.empty())
    lines.add_wrapped(words("run: none followed; kiln top --metrics HOST:PORT follows one"), "",
                      "  ", " ");
  for (const TopRun& run : frame.runs) render_run(run, lines);
  return lines.text();
}

std::string fit_to_height(std::string_view text, int rows) {
  rows = std::max(rows, 1);
  const auto lines = std::count(text.begin(), text.end(), '\n');
  if (lines <= rows) return std::string(text);
  size_t end = 0;
  for (int row = 0; row < rows - 1; ++row) end = text.find('\n', end) + 1;
  return fmt::format("{}({} more lines)\n", text.substr(0, end), lines - (rows - 1));
}

}  // namespace kiln
