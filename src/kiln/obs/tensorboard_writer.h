// TensorBoardWriter: one TensorBoard event file (format: tensorboard_format.h), written on a
// thread of its own so that the training step never waits for the disk.
//
// add_scalar() and add_text() encode the event and puts it on a bounded queue; the writer thread takes all that
// is queued, frames it and writes it with one write(2), no fsync. When the queue already holds
// `queue_size` events (the disk is slower than the run), the new event is dropped and counted; the
// closing writer says how many on stderr. A failed write (disk full, I/O error) never stops
// training: the writer reports it once, one line on stderr naming the file, and drops every later
// event. Opening is the only failure that throws: a kiln::Error naming the folder or file.
//
// Megatron's --tensorboard-queue-size is PyTorch SummaryWriter's max_queue, the events it holds
// before a flush; here it bounds the events waiting for the writer thread, beyond which they drop.
//
// add_scalar(), add_text() and flush() may be called from any thread. The destructor writes what is queued,
// then closes the file.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kiln {

class TensorBoardWriter {
 public:
  // A new file in `folder` (created with its parents), named as TensorFlow and PyTorch name theirs:
  // events.out.tfevents.<seconds since 1970>.<host name>.<pid>.<counter>; the counter makes the
  // name new within a process (a file is never reused: a resumed run adds one).
  static std::unique_ptr<TensorBoardWriter> create_in(const std::string& folder, size_t queue_size);
  // `path` itself, created or truncated (tests point it at /dev/full or a pipe).
  static std::unique_ptr<TensorBoardWriter> open_file(const std::string& path, size_t queue_size);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // The scalar `value` of `tag` at `step`, stamped with the wall-clock time now. Never blocks on
  // the disk (only, briefly, on the queue's lock).
  void add_scalar(std::string_view tag, float value, int64_t step);
  // A text summary (TensorBoard's Text tab) of `tag` at `step`, stamped likewise; never blocks on
  // the disk.
  void add_text(std::string_view tag, std::string_view text, int64_t step);
  // Waits until every event added before the call is written or dropped.
  void flush();

  const std::string& path() const { return path_; }
  int64_t dropped_events() const { return dropped_full_queue_ + dropped_after_failure_; }
  bool write_failed() const { return write_failed_; }

 private:
  TensorBoardWriter(std::string path, int fd, size_t queue_size);
  bool dropping_after_failure();  // counts the event being added as dropped when it is
  void enqueue(std::string event);
  void write_queued_events();  // the writer thread's loop
  void write_batch(const std::vector<std::string>& events);

  const std::string path_;
  const int fd_;
  const size_t queue_size_;
  std::mutex mutex_;
  std::condition_variable events_queued_;
  std::condition_variable events_handled_;
  std::vector<std::string> queue_;  // serialised Events, oldest first
  int64_t added_ = 0;               // events queued so far
  int64_t handled_ = 0;             // of which written, or dropped after a failed write
  bool closing_ = false;
  std::atomic<int64_t> dropped_full_queue_{0};
  std::atomic<int64_t> dropped_after_failure_{0};
  std::atomic<bool> write_failed_{false};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace kiln
