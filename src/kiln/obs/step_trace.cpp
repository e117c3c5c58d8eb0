#include "kiln/obs/step_trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/trace.h"
#include "kiln/obs/chrome_trace.h"

namespace kiln {
namespace {

std::string written_iterations_of(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : fmt::format("{}..{}", first, last);
}

}  // namespace

std::string step_trace_file_name(const std::string& profile_name, int64_t rank, int64_t world_size) {
  if (!profile_name.empty())
    return world_size > 1 ? fmt::format("{}_rank{}.pt.trace.json", profile_name, rank)
                          : profile_name + ".pt.trace.json";
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "host");
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return fmt::format("{}_{}.{}.pt.trace.json", host, getpid(), ms);
}

StepTraceObserver::StepTraceObserver(StepTraceOptions options, TracingBackend& backend)
    : options_(std::move(options)), backend_(backend) {
  KILN_CHECK(options_.step_start >= 0 && options_.step_end > options_.step_start,
             "the step trace covers the iterations after {} up to {}: none", options_.step_start, options_.step_end);
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  KILN_CHECK(!error && std::filesystem::is_directory(options_.dir),
             "cannot create the trace folder '{}': {}", options_.dir,
             error ? error.message() : "a file of that name is in the way");
  path_ = (std::filesystem::path(options_.dir) / options_.file_name).string();
  // Tried now, so that a folder that takes no files fails before the first step, not after it.
  const std::string probe = path_ + ".probe";
  KILN_CHECK(std::ofstream(probe).good(), "cannot write the trace into '{}' (tried '{}')", options_.dir, probe);
  std::filesystem::remove(probe, error);
}

StepTraceObserver::~StepTraceObserver() {
  if (!recording_) return;
  trace::stop_recording();
  backend_.stop_device_timing();
}

void StepTraceObserver::on_iteration_begin(int64_t iteration) {
  if (recording_ || !written_path_.empty() || iteration <= options_.step_start || iteration > options_.step_end) return;
  origin_ns_ = trace::now_ns();  // before anything is recorded, so no event starts before it
  trace::start_recording();
  backend_.start_device_timing();
  recording_ = true;
  first_traced_ = iteration;
}

void StepTraceObserver::on_iteration(const IterationStats& stats) {
  if (!recording_) return;
  backend_.record_device_work();
  last_traced_ = stats.iteration;
  if (stats.iteration >= options_.step_end) write();
}

void StepTraceObserver::finish() {
  if (recording_) write();
}

void StepTraceObserver::write() {
  trace::stop_recording();
  backend_.stop_device_timing();
  recording_ = false;
  const std::vector<trace::Track> tracks = trace::take_recording();
  ChromeTraceProcess process{options_.rank, options_.process_name, origin_ns_, {}};
  process.other_data = {{"producer", "kiln"}, {"iterations", written_iterations_of(first_traced_, last_traced_)},
                        {"rank", std::to_string(options_.rank)}};
  write_file_atomically(path_, chrome_trace_json(tracks, process));
  written_path_ = path_;
}

std::string StepTraceObserver::written_iterations() const {
  return written_path_.empty() ? "" : written_iterations_of(first_traced_, last_traced_);
}

}  // namespace kiln
