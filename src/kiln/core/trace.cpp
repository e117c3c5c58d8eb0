#include "kiln/core/trace.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace kiln::trace {
namespace {

struct Buffer {
  std::mutex mutex;
  Track track;
};

struct Recorder {
  std::atomic<bool> on{false};
  std::mutex mutex;  // guards the lists below; where a buffer's lock is taken too, it is taken first
  std::vector<std::shared_ptr<Buffer>> threads;                 // every thread that recorded or was named
  std::map<std::string, std::shared_ptr<Buffer>> device_tracks;  // by name
  int64_t next_id = 1;

  std::shared_ptr<Buffer> add(std::string name, bool device) {
    auto buffer = std::make_shared<Buffer>();
    buffer->track.device = device;
    const std::lock_guard lock(mutex);
    buffer->track.id = next_id++;
    buffer->track.name = name.empty() ? "thread " + std::to_string(buffer->track.id) : std::move(name);
    return buffer;
  }
};

Recorder& recorder() {
  static Recorder* const instance = new Recorder;  // never destroyed: threads may record at exit
  return *instance;
}

// A thread's buffer is held by the thread (thread_local) and by the registry; once the thread has
// ended, by the registry alone.
bool thread_ended(const std::shared_ptr<Buffer>& buffer, long other_holders) {
  return buffer.use_count() == 1 + other_holders;
}

// The calling thread's buffer, registered on first use. Registering forgets the buffers of threads
// that have ended and hold no events, so that a process making many threads keeps few.
Buffer& this_thread(std::string name = {}) {
  thread_local std::shared_ptr<Buffer> buffer;
  if (!buffer) {
    Recorder& r = recorder();
    buffer = r.add(std::move(name), false);
    const std::lock_guard lock(r.mutex);
    std::erase_if(r.threads, [](const std::shared_ptr<Buffer>& other) {
      if (!thread_ended(other, 0)) return false;
      const std::lock_guard events_lock(other->mutex);
      return other->track.events.empty();
    });
    r.threads.push_back(buffer);
  }
  return *buffer;
}

void append(Buffer& buffer, Event event) {
  const std::lock_guard lock(buffer.mutex);
  buffer.track.events.push_back(std::move(event));
}

}  // namespace

bool recording() { return recorder().on.load(std::memory_order_relaxed); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void name_this_thread(std::string name) {
  Buffer& buffer = this_thread(name);
  const std::lock_guard lock(buffer.mutex);
  buffer.track.name = std::move(name);
}

Span::Span(const char* category, std::string_view name) : category_(category) {
  if (!recording()) return;
  name_ = name;
  start_ns_ = now_ns();
}

Span::~Span() {
  if (start_ns_ < 0 || !recording()) return;
  complete(category_, std::move(name_), start_ns_, now_ns() - start_ns_);
}

void complete(const char* category, std::string name, int64_t start_ns, int64_t duration_ns) {
  if (!recording()) return;
  append(this_thread(), {Event::Kind::Complete, category, std::move(name), start_ns, duration_ns, 0});
}

void complete_on_track(const std::string& track, const char* category, std::string name, int64_t start_ns,
                       int64_t duration_ns) {
  if (!recording()) return;
  Recorder& r = recorder();
  std::shared_ptr<Buffer> buffer;
  {
    const std::lock_guard lock(r.mutex);
    if (const auto found = r.device_tracks.find(track); found != r.device_tracks.end()) buffer = found->second;
  }
  if (!buffer) {
    buffer = r.add(track, true);
    const std::lock_guard lock(r.mutex);
    buffer = r.device_tracks.try_emplace(track, buffer).first->second;  // the first one made, if two raced
  }
  append(*buffer, {Event::Kind::Complete, category, std::move(name), start_ns, duration_ns, 0});
}

void counter(const char* name, double value) {
  if (!recording()) return;
  append(this_thread(), {Event::Kind::Counter, "counter", name, now_ns(), 0, value});
}

void start_recording() {
  stop_recording();
  take_recording();
  recorder().on.store(true, std::memory_order_relaxed);
}

void stop_recording() { recorder().on.store(false, std::memory_order_relaxed); }

std::vector<Track> take_recording() {
  Recorder& r = recorder();
  std::vector<std::shared_ptr<Buffer>> buffers;
  {
    const std::lock_guard lock(r.mutex);
    buffers = r.threads;
    for (const auto& [name, buffer] : r.device_tracks) buffers.push_back(buffer);
    // A thread that has ended holds its buffer no more: forget it once its events are taken (the
    // copy in `buffers` is the other holder).
    std::erase_if(r.threads, [](const std::shared_ptr<Buffer>& buffer) { return thread_ended(buffer, 1); });
  }
  std::vector<Track> tracks;
  for (const std::shared_ptr<Buffer>& buffer : buffers) {
    const std::lock_guard lock(buffer->mutex);
    if (buffer->track.events.empty()) continue;
    Track taken{buffer->track.name, buffer->track.device, buffer->track.id, {}};
    taken.events.swap(buffer->track.events);
    tracks.push_back(std::move(taken));
  }
  return tracks;
}

}  // namespace kiln::trace
