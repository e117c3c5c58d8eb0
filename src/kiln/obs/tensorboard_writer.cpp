#include "kiln/obs/tensorboard_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "kiln/core/error.h"
#include "kiln/obs/tensorboard_format.h"

namespace kiln {
namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name : "localhost";
}

// strerror's text, thread-safe.
std::string errno_message() { return std::error_code(errno, std::generic_category()).message(); }

// Writes all of `bytes`, across partial writes and interrupts; errno tells why when it fails.
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written == 0) errno = EIO;  // no progress and no reason: call it an I/O error
    if (written <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

}  // namespace

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::create_in(const std::string& folder, size_t queue_size) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  KILN_CHECK(!error, "cannot write TensorBoard events into '{}': cannot create the folder: {}", folder,
             error.message());
  // Process-wide, so that two writers of one process in one second get two files; O_EXCL skips a
  // name another process took.
  static std::atomic<int64_t> counter{0};
  const std::string prefix = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.", folder,
                                         static_cast<int64_t>(std::time(nullptr)), host_name(), ::getpid());
  for (;;) {
    std::string path = prefix + std::to_string(counter++);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return std::unique_ptr<TensorBoardWriter>(new TensorBoardWriter(std::move(path), fd, queue_size));
    KILN_CHECK(errno == EEXIST, "cannot write TensorBoard events into '{}': cannot create '{}': {}", folder, path,
               errno_message());
  }
}

std::unique_ptr<TensorBoardWriter> TensorBoardWriter::open_file(const std::string& path, size_t queue_size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "cannot write TensorBoard events to '{}': {}", path, errno_message());
  return std::unique_ptr<TensorBoardWriter>(new TensorBoardWriter(path, fd, queue_size));
}

TensorBoardWriter::TensorBoardWriter(std::string path, int fd, size_t queue_size)
    : path_(std::move(path)), fd_(fd), queue_size_(queue_size), thread_([this] { write_queued_events(); }) {
  enqueue(encode_file_version_event(seconds_since_epoch()));
}

TensorBoardWriter::~TensorBoardWriter() {
  {
    const std::lock_guard lock(mutex_);
    closing_ = true;
  }
  events_queued_.notify_one();
  thread_.join();
  ::close(fd_);
  if (dropped_full_queue_ > 0)
    std::fputs(fmt::format("kiln: TensorBoard: {} events were dropped, not written to '{}': the writer fell behind "
                           "the run (a queue of {}: --tensorboard-queue-size)\n",
                           dropped_full_queue_.load(), path_, queue_size_)
                   .c_str(),
               stderr);
}

void TensorBoardWriter::add_scalar(std::string_view tag, float value, int64_t step) {
  if (!dropping_after_failure()) enqueue(encode_scalar_event(seconds_since_epoch(), step, tag, value));
}

void TensorBoardWriter::add_text(std::string_view tag, std::string_view text, int64_t step) {
  if (!dropping_after_failure()) enqueue(encode_text_event(seconds_since_epoch(), step, tag, text));
}

bool TensorBoardWriter::dropping_after_failure() {
  if (!write_failed_) return false;
  ++dropped_after_failure_;
  return true;
}

void TensorBoardWriter::enqueue(std::string event) {
  {
    const std::lock_guard lock(mutex_);
    if (queue_.size() >= queue_size_) {
      ++dropped_full_queue_;
      return;
    }
    queue_.push_back(std::move(event));
    ++added_;
  }
  events_queued_.notify_one();
}

void TensorBoardWriter::flush() {
  std::unique_lock lock(mutex_);
  const int64_t target = added_;
  events_handled_.wait(lock, [&] { return handled_ >= target; });
}

void TensorBoardWriter::write_queued_events() {
  std::vector<std::string> batch;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      events_queued_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and all written
      batch.swap(queue_);
    }
    write_batch(batch);
    {
      const std::lock_guard lock(mutex_);
      handled_ += static_cast<int64_t>(batch.size());
    }
    events_handled_.notify_all();
    batch.clear();
  }
}

void TensorBoardWriter::write_batch(const std::vector<std::string>& events) {
  if (!write_failed_) {
    std::string records;
    for (const std::string& event : events) append_tf_record(records, event);
    if (write_all(fd_, records)) return;
    write_failed_ = true;
    std::fputs(fmt::format("kiln: TensorBoard: writing '{}' failed ({}); training goes on, its later events are "
                           "dropped\n",
                           path_, errno_message())
                   .c_str(),
               stderr);
  }
  dropped_after_failure_ += static_cast<int64_t>(events.size());
}

}  // namespace kiln
