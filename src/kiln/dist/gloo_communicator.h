// GlooCommunicator: the Communicator of CPU ranks, on Gloo (Debian's libgloo, the library behind
// PyTorch's "gloo" process group) over TCP. Gloo moves and reduces the bytes; this class only
// queues the operations on one communication thread, so a rank's backward keeps computing while
// its finished gradient buckets are reduced (ARCHITECTURE.md decision 7's overlap, on a thread).
//
// Connection: the ranks exchange their Gloo addresses through the rendezvous store (store.h) and
// connect a full mesh; construction returns when every rank is connected or throws after
// `timeout`. Every operation, the connection included, is bounded by `timeout`.
// Memory: every buffer is host memory (the CPU back-end's tensors).
// Failure: an engine error (a peer that died: connection reset; one that hangs: timeout) is
// rethrown from CommWork::wait / the blocking calls as a kiln::Error naming the operation; the
// communicator is unusable afterwards. Destruction waits for the operation in flight, then closes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/dist/communicator.h"

namespace gloo {
class Context;
}

namespace kiln {

class StoreClient;

class GlooCommunicator final : public Communicator {
 public:
  // Where the other ranks reach this one: a network interface's name (`iface`, e.g. "eth0") or
  // else a host name or address (127.0.0.1 on one machine). `store` is used only here.
  struct Address {
    std::string hostname, iface;
  };
  // `explain_failure`, when given, is asked after an operation fails which ranks are to blame
  // (communicator.h): Gloo's own errors name sockets, not ranks. Its I/O errors (timeouts, lost
  // connections) are peer faults; any other error is this rank's own.
  GlooCommunicator(int rank, int world_size, StoreClient& store, const Address& address,
                   std::chrono::milliseconds timeout, FailureExplainer explain_failure = {});
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override { return "gloo"; }
  std::unique_ptr<CommWork> all_reduce(Tensor data, ReduceOp op) override;
  // Buffers up to kPreparedElements: Gloo's halving-doubling all-reduce, set up once on the
  // communication thread (it holds a receive buffer as large as `data`); larger ones, whose time
  // is the bytes' rather than the set-up's, are one-off all-reduces.
  std::unique_ptr<PreparedAllReduce> prepare_all_reduce(Tensor data) override;
  static constexpr int64_t kPreparedElements = int64_t{4} << 20;
  std::unique_ptr<CommWork> reduce_scatter(Tensor data) override;
  std::unique_ptr<CommWork> reduce(Tensor data, int root) override;
  std::unique_ptr<CommWork> all_gather(Tensor data) override;
  std::unique_ptr<CommWork> broadcast(Tensor data, int root) override;
  void barrier() override;
  void all_reduce_host(std::span<double> values, ReduceOp op) override;

 private:
  struct Job;
  class Prepared;
  // Queues `run` on the communication thread; `what` names the operation in errors.
  std::unique_ptr<CommWork> submit(std::string what, std::function<void()> run);
  void thread_loop();

  const int rank_, world_size_;
  std::shared_ptr<gloo::Context> context_;
  FailureExplainer explain_failure_;
  std::exception_ptr first_failure_;  // touched by the communication thread only
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln
