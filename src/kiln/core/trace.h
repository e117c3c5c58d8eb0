// Step-trace recording (--profile, obs/step_trace.h): timed spans on the threads that do a step's
// work (the trainer, the loader's workers, the communication thread), counters, and device work
// timed elsewhere and placed on a track of its own (a CUDA stream). Any layer may record; one
// recorder per process collects everything between start_recording() and stop_recording().
//
// Cost when not recording: a Span is one relaxed atomic load and no clock read, so spans stay in
// hot paths for good. While recording, each thread appends to a buffer of its own (one uncontended
// lock per event); take_recording() hands every buffer's events over.
//
// Times are steady_clock nanoseconds (now_ns()), the same clock on every thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::trace {

// Whether events are being recorded now.
bool recording();
int64_t now_ns();

// Names the calling thread's track ("trainer", "loader worker 2"); kept for the thread's life,
// whether or not a recording is on. A thread never named is "thread <n>".
void name_this_thread(std::string name);

// A complete event on the calling thread: from construction to destruction, recorded when the
// recorder was on at construction. `category` must outlive the recording (a literal); `name` is
// copied only when recorded. Spans on one thread nest as their lifetimes do.
class Span {
 public:
  Span(const char* category, std::string_view name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* category_;
  std::string name_;
  int64_t start_ns_ = -1;  // -1: not recording
};

// A complete event measured by the caller, on the calling thread's track, or on the track named
// `track` (device work: "compute stream"), which holds nothing else.
void complete(const char* category, std::string name, int64_t start_ns, int64_t duration_ns);
void complete_on_track(const std::string& track, const char* category, std::string name, int64_t start_ns,
                       int64_t duration_ns);
// A value of the counter `name` from now on ("memory allocated (bytes)"), on the process's counter track.
void counter(const char* name, double value);

// One recorded event. A track is a thread (its name) or a named device track.
struct Event {
  enum class Kind { Complete, Counter };
  Kind kind = Kind::Complete;
  const char* category = "";
  std::string name;
  int64_t start_ns = 0;
  int64_t duration_ns = 0;  // Complete
  double value = 0;         // Counter
};

struct Track {
  std::string name;
  bool device = false;  // a device track, not a thread
  int64_t id = 0;       // distinct per track, stable for the process's life
  std::vector<Event> events;  // in recording order
};

// Starts recording (dropping anything left from an earlier recording); stops it.
void start_recording();
void stop_recording();
// Every track's events since start_recording(), each track's in order; tracks with no events are
// left out. Call after stop_recording(); clears them.
std::vector<Track> take_recording();

}  // namespace kiln::trace
