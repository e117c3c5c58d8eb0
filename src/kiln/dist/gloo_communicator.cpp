#include "kiln/dist/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <exception>
#include <future>

#include "kiln/core/error.h"
#include "kiln/core/latency_sensitive_thread.h"
#include "kiln/core/trace.h"
#include "kiln/dist/store.h"

namespace kiln {
namespace {

// Gloo's rendezvous::Store over kiln's store client: Gloo ships no TCP store of its own in the
// Debian build, and the ranks already share kiln's.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(StoreClient& client) : client_(client) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return client_.get(key); }
  void wait(const std::vector<std::string>& keys) override { client_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    client_.wait(keys, timeout);
  }

 private:
  StoreClient& client_;
};

template <typename T>
gloo::AllreduceOptions::Func reduction(ReduceOp op) {
  using Raw = void (*)(void*, const void*, const void*, size_t);
  return op == ReduceOp::Sum ? static_cast<Raw>(&gloo::sum<T>) : static_cast<Raw>(&gloo::max<T>);
}

// Gloo's all-reduce (ring by default): every rank ends with the same bits.
template <typename T>
void all_reduce_in_place(const std::shared_ptr<gloo::Context>& context, T* data, size_t count, ReduceOp op) {
  gloo::AllreduceOptions options(context);
  options.setOutput(data, count);
  options.setReduceFunction(reduction<T>(op));
  gloo::allreduce(options);
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

void check_host(const Tensor& data, const char* operation) {
  KILN_CHECK(data.device == Device::CPU,
             "gloo {}: the buffer is on the GPU; the gloo backend reduces host memory (use "
             "--distributed-backend nccl with --device cuda)",
             operation);
}

void check_shards(const Tensor& data, int world_size, const char* operation) {
  KILN_CHECK(data.numel() % world_size == 0, "gloo {}: {} elements do not split into {} equal shards", operation,
             data.numel(), world_size);
}

// Connects this rank to every other one through the store (see the class comment).
std::shared_ptr<gloo::Context> connect(int rank, int world_size, StoreClient& store,
                                       const GlooCommunicator::Address& address, std::chrono::milliseconds timeout) {
  gloo::transport::tcp::attr attr;
  attr.hostname = address.hostname;
  attr.iface = address.iface;
  const std::string where = address.iface.empty() ? address.hostname : "interface " + address.iface;
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(timeout);
    GlooStoreAdapter adapter(store);
    gloo::rendezvous::PrefixStore prefixed("gloo", adapter);
    context->connectFullMesh(prefixed, device);
    return context;
  } catch (const Error&) {
    throw;  // the store's own error names the key and address
  } catch (const std::exception& error) {
    fail("gloo: rank {} of {} could not connect to the other ranks from {}: {}", rank, world_size, where,
         error.what());
  }
}

}  // namespace

struct GlooCommunicator::Job final : CommWork {
  std::string what;
  std::function<void()> run;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr failure;

  void wait() override {
    std::unique_lock lock(mutex);
    finished.wait(lock, [&] { return done; });
    if (failure) std::rethrow_exception(failure);
  }
};

namespace {

// CommWork handed to the caller: shares the job with the queue.
struct JobHandle final : CommWork {
  std::shared_ptr<CommWork> job;
  void wait() override { job->wait(); }
};

}  // namespace

GlooCommunicator::GlooCommunicator(int rank, int world_size, StoreClient& store, const Address& address,
                                   std::chrono::milliseconds timeout, FailureExplainer explain_failure)
    : rank_(rank), world_size_(world_size), explain_failure_(std::move(explain_failure)) {
  // Gloo writes to its sockets with writev, which raises SIGPIPE once a peer has died: the process
  // would end silently, naming no rank. Ignored (as Python, so PyTorch, ignores it), the write fails
  // with EPIPE and Gloo throws, and the failure names the lost rank.
  std::signal(SIGPIPE, SIG_IGN);
  // The communication thread connects, so that Gloo's TCP event loop, which the device starts,
  // inherits its short time slice: both sleep on the network and must run as soon as bytes
  // arrive, even while the compute threads keep every core busy (latency_sensitive_thread.h).
  std::promise<void> connected;
  auto connection = connected.get_future();
  thread_ = std::thread([this, &connected, &store, &address, timeout] {
    trace::name_this_thread("communication (gloo)");
    request_short_time_slice();
    try {
      context_ = connect(rank_, world_size_, store, address, timeout);
    } catch (...) {
      connected.set_exception(std::current_exception());
      return;
    }
    connected.set_value();
    thread_loop();
  });
  try {
    connection.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

void GlooCommunicator::thread_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = jobs_.front();
      jobs_.pop_front();
    }
    // After a failure the group is broken: what was queued behind it fails at once with the same
    // error instead of each waiting out the timeout on a peer that is gone.
    std::exception_ptr failure = first_failure_;
    if (!failure) {
      try {
        const trace::Span span("communication", job->what);
        job->run();
      } catch (const std::exception& error) {
        const bool peer_fault = dynamic_cast<const gloo::IoException*>(&error) != nullptr;
        const std::string culprit = explain_failure_ ? explain_failure_(peer_fault) : "";
        failure = first_failure_ = std::make_exception_ptr(Error(fmt::format(
            "gloo {} on rank {} of {} failed: {}{} (a rank died, hung or was stopped: a lost peer closes its "
            "connections, a hung one runs into --distributed-timeout-minutes)",
            job->what, rank_, world_size_, culprit.empty() ? "" : culprit + ": ", error.what())));
      }
    }
    std::lock_guard lock(job->mutex);
    job->done = true;
    job->failure = failure;
    job->finished.notify_all();
  }
}

std::unique_ptr<CommWork> GlooCommunicator::submit(std::string what, std::function<void()> run) {
  auto job = std::make_shared<Job>();
  job->what = std::move(what);
  job->run = std::move(run);
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(job);
  }
  queued_.notify_one();
  auto handle = std::make_unique<JobHandle>();
  handle->job = std::move(job);
  return handle;
}

std::unique_ptr<CommWork> GlooCommunicator::all_reduce(Tensor data, ReduceOp op) {
  check_host(data, "all_reduce");
  KILN_CHECK(data.dtype == DType::F32, "gloo all_reduce: fp32 buffers only, got {}", dtype_name(data.dtype));
  return submit(fmt::format("all_reduce ({}, {} floats)", op_name(op), data.numel()), [this, data, op] {
    all_reduce_in_place(context_, data.as<float>(), static_cast<size_t>(data.numel()), op);
  });
}

// Built by the first job and run by each start's, all on the communication thread: so every rank
// builds it (taking its slots of the context) at the same place among its operations.
class GlooCommunicator::Prepared final : public PreparedAllReduce {
 public:
  Prepared(GlooCommunicator& communicator, Tensor data) : communicator_(communicator), data_(data) {
    // Jobs hold the algorithm by a shared pointer: it lives as long as this or a job in the queue.
    communicator_.submit(fmt::format("prepare all_reduce ({} floats)", data.numel()),
                         [algorithm = algorithm_, context = communicator_.context_, data] {
                           *algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
                               context, std::vector<float*>{data.as<float>()}, static_cast<int>(data.numel()));
                         });
  }
  std::unique_ptr<CommWork> start() override {
    return communicator_.submit(fmt::format("all_reduce (sum, {} floats)", data_.numel()),
                                [algorithm = algorithm_] { (*algorithm)->run(); });
  }

 private:
  GlooCommunicator& communicator_;
  Tensor data_;
  std::shared_ptr<std::unique_ptr<gloo::Algorithm>> algorithm_ = std::make_shared<std::unique_ptr<gloo::Algorithm>>();
};

std::unique_ptr<PreparedAllReduce> GlooCommunicator::prepare_all_reduce(Tensor data) {
  check_host(data, "all_reduce");
  KILN_CHECK(data.dtype == DType::F32, "gloo all_reduce: fp32 buffers only, got {}", dtype_name(data.dtype));
  if (data.numel() > kPreparedElements || data.numel() == 0) return Communicator::prepare_all_reduce(data);
  return std::make_unique<Prepared>(*this, data);
}

std::unique_ptr<CommWork> GlooCommunicator::reduce_scatter(Tensor data) {
  check_host(data, "reduce_scatter");
  check_shards(data, world_size_, "reduce_scatter");
  KILN_CHECK(data.dtype == DType::F32, "gloo reduce_scatter: fp32 buffers only, got {}", dtype_name(data.dtype));
  // Gloo's one reduce-scatter (ReduceScatterHalvingDoubling, libgloo 2022-05) leaves partial sums
  // in some ranks' shards at 3 and 4 ranks (GlooCommunicator.ReduceScatterLeavesEachRankTheSumOf-
  // ItsShard caught it), so the shards come from Gloo's ring all-reduce of the whole buffer: right
  // on every rank, at twice a reduce-scatter's bytes.
  return submit(fmt::format("reduce_scatter ({} floats)", data.numel()), [this, data] {
    all_reduce_in_place(context_, data.as<float>(), static_cast<size_t>(data.numel()), ReduceOp::Sum);
  });
}

std::unique_ptr<CommWork> GlooCommunicator::reduce(Tensor data, int root) {
  check_host(data, "reduce");
  KILN_CHECK(data.dtype == DType::F32, "gloo reduce: fp32 buffers only, got {}", dtype_name(data.dtype));
  KILN_CHECK(root >= 0 && root < world_size_, "gloo reduce: root {} outside world size {}", root, world_size_);
  return submit(fmt::format("reduce ({} floats to rank {})", data.numel(), root), [this, data, root] {
    gloo::ReduceOptions options(context_);
    options.setOutput(data.as<float>(), static_cast<size_t>(data.numel()));
    options.setRoot(root);
    options.setReduceFunction(reduction<float>(ReduceOp::Sum));
    gloo::reduce(options);
  });
}

std::unique_ptr<CommWork> GlooCommunicator::all_gather(Tensor data) {
  check_host(data, "all_gather");
  check_shards(data, world_size_, "all_gather");
  return submit(fmt::format("all_gather ({} bytes)", data.bytes()), [this, data] {
    const size_t shard = data.bytes() / static_cast<size_t>(world_size_);
    char* bytes = data.as<char>();
    // In place: Gloo reads this rank's input from its own slot of the output when no input is set.
    gloo::AllgatherOptions options(context_);
    options.setOutput(bytes, shard * static_cast<size_t>(world_size_));
    gloo::allgather(options);
  });
}

std::unique_ptr<CommWork> GlooCommunicator::broadcast(Tensor data, int root) {
  check_host(data, "broadcast");
  KILN_CHECK(root >= 0 && root < world_size_, "gloo broadcast: root {} outside world size {}", root, world_size_);
  return submit(fmt::format("broadcast ({} bytes from rank {})", data.bytes(), root), [this, data, root] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(data.as<char>(), data.bytes());
    options.setRoot(root);
    gloo::broadcast(options);
  });
}

void GlooCommunicator::barrier() {
  submit("barrier", [this] {
    gloo::BarrierOptions options(context_);
    gloo::barrier(options);
  })->wait();
}

void GlooCommunicator::all_reduce_host(std::span<double> values, ReduceOp op) {
  if (values.empty()) return;
  submit(fmt::format("all_reduce of {} scalars ({})", values.size(), op_name(op)), [this, values, op] {
    all_reduce_in_place(context_, values.data(), values.size(), op);
  })->wait();
}

}  // namespace kiln
