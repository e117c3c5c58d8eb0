#include "kiln/dist/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/error.h"
#include "kiln/dist/store.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

std::string minutes(std::chrono::milliseconds timeout) {
  return fmt::format("{:g} min", static_cast<double>(timeout.count()) / 60'000.0);
}

// Between polls: spin a little (a bucket's reduction often ends within microseconds of the
// backward), then sleep, so a long wait costs no CPU core.
void pause_between_polls(int polls) {
  if (polls < 200)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

class NcclCommunicator;

struct NcclWork final : CommWork {
  NcclCommunicator* communicator = nullptr;
  cudaEvent_t done = nullptr;
  std::string what;
  bool finished = false;
  ~NcclWork() override;
  void wait() override;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, int device, StoreClient& store, std::chrono::milliseconds timeout,
                   FailureExplainer explain_failure)
      : rank_(rank), world_size_(world_size), timeout_(timeout), explain_failure_(std::move(explain_failure)) {
    int visible = 0;
    check(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
    KILN_CHECK(device >= 0 && device < visible,
               "nccl: rank {}'s GPU {} (its local rank) does not exist: {} GPU(s) are visible; start one rank per "
               "GPU (--nproc-per-node, srun --ntasks-per-node) or check CUDA_VISIBLE_DEVICES",
               rank, device, visible);
    check(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    const std::string key = "nccl/unique_id";
    if (rank == 0) {
      settle(ncclGetUniqueId(&id), "making the group's unique id");
      store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::vector<char> bytes = store.get(key);  // bounded by the store's timeout
      KILN_CHECK(bytes.size() == sizeof(id.internal),
                 "nccl: the unique id in the rendezvous store is {} bytes, not {}: another program wrote '{}'",
                 bytes.size(), sizeof(id.internal), key);
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // polled below, so a rank that never comes ends the wait at the timeout
    settle(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config),
           fmt::format("connecting (GPU {})", device));
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the communication stream");
    check(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "creating an event");
    check(cudaMalloc(&scalars_, kMaxHostScalars * sizeof(double)), "allocating the scalars' buffer");
  }

  ~NcclCommunicator() override {
    if (comm_) {
      // Finalize flushes the operations in flight; a peer that is gone makes it wait forever, so
      // it is bounded like everything else and the communicator aborted past the timeout.
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + timeout_;
      for (int polls = 0; state == ncclInProgress && Clock::now() < deadline; ++polls) {
        pause_between_polls(polls);
        ncclCommGetAsyncError(comm_, &state);
      }
      if (state == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (scalars_) cudaFree(scalars_);
    if (compute_ready_) cudaEventDestroy(compute_ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override { return "nccl"; }

  std::unique_ptr<CommWork> all_reduce(Tensor data, ReduceOp op) override {
    check_device(data, "all_reduce");
    KILN_CHECK(data.dtype == DType::F32, "nccl all_reduce: fp32 buffers only, got {}", dtype_name(data.dtype));
    return enqueue(fmt::format("all_reduce ({}, {} floats)", op_name(op), data.numel()), [&] {
      return ncclAllReduce(data.data, data.data, static_cast<size_t>(data.numel()), ncclFloat32,
                           op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream_);
    });
  }

  std::unique_ptr<CommWork> reduce_scatter(Tensor data) override {
    check_device(data, "reduce_scatter");
    check_shards(data, "reduce_scatter");
    KILN_CHECK(data.dtype == DType::F32, "nccl reduce_scatter: fp32 buffers only, got {}", dtype_name(data.dtype));
    const int64_t shard = data.numel() / world_size_;
    return enqueue(fmt::format("reduce_scatter ({} floats)", data.numel()), [&] {
      // In place: NCCL's rule is that the output is the input's shard of this rank.
      return ncclReduceScatter(data.data, data.slice(rank_ * shard, shard).data, static_cast<size_t>(shard),
                               ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  std::unique_ptr<CommWork> reduce(Tensor data, int root) override {
    check_device(data, "reduce");
    KILN_CHECK(data.dtype == DType::F32, "nccl reduce: fp32 buffers only, got {}", dtype_name(data.dtype));
    KILN_CHECK(root >= 0 && root < world_size_, "nccl reduce: root {} outside world size {}", root, world_size_);
    return enqueue(fmt::format("reduce ({} floats to rank {})", data.numel(), root), [&] {
      return ncclReduce(data.data, data.data, static_cast<size_t>(data.numel()), ncclFloat32, ncclSum, root, comm_,
                        stream_);
    });
  }

  std::unique_ptr<CommWork> all_gather(Tensor data) override {
    check_device(data, "all_gather");
    check_shards(data, "all_gather");
    const size_t shard = data.bytes() / static_cast<size_t>(world_size_);
    return enqueue(fmt::format("all_gather ({} bytes)", data.bytes()), [&] {
      // In place: the input is this rank's shard of the output; bytes, so any dtype moves.
      return ncclAllGather(static_cast<char*>(data.data) + static_cast<size_t>(rank_) * shard, data.data, shard,
                           ncclInt8, comm_, stream_);
    });
  }

  std::unique_ptr<CommWork> broadcast(Tensor data, int root) override {
    check_device(data, "broadcast");
    KILN_CHECK(root >= 0 && root < world_size_, "nccl broadcast: root {} outside world size {}", root, world_size_);
    return enqueue(fmt::format("broadcast ({} bytes from rank {})", data.bytes(), root), [&] {
      return ncclBroadcast(data.data, data.data, data.bytes(), ncclInt8, root, comm_, stream_);
    });
  }

  // NCCL has no barrier: an all-reduce of one element that every rank must join.
  void barrier() override {
    host_round_trip("barrier", 1, ReduceOp::Sum);
  }

  void all_reduce_host(std::span<double> values, ReduceOp op) override {
    for (size_t first = 0; first < values.size(); first += kMaxHostScalars) {
      const std::span<double> part = values.subspan(first, std::min(kMaxHostScalars, values.size() - first));
      std::memcpy(host_scalars_, part.data(), part.size_bytes());
      host_round_trip(fmt::format("all_reduce of {} scalars ({})", part.size(), op_name(op)), part.size(), op);
      std::memcpy(part.data(), host_scalars_, part.size_bytes());
    }
  }

  // Polls `done` (or NCCL's state when `done` is null) until it is reached; throws as the header says.
  void wait_for(cudaEvent_t done, const std::string& what) {
    throw_if_broken();
    const auto deadline = Clock::now() + timeout_;
    for (int polls = 0;; ++polls) {
      const cudaError_t state = cudaEventQuery(done);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) {
        cudaGetLastError();
        abort_and_fail(what, fmt::format("CUDA error: {}", cudaGetErrorString(state)), false);
      }
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();  // a poll's answer, not a fault
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) abort_and_fail(what, nccl_error(async), remote_fault(async));
      if (Clock::now() > deadline)
        abort_and_fail(what, fmt::format("not done after {} (--distributed-timeout-minutes)", minutes(timeout_)), true);
      pause_between_polls(polls);
    }
  }

 private:
  static constexpr size_t kMaxHostScalars = 4096;

  template <typename Launch>
  std::unique_ptr<CommWork> enqueue(std::string what, const Launch& launch) {
    throw_if_broken();
    KILN_CHECK(!cuda::compute_stream_capturing(),
               "nccl {}: issued while the compute stream is captured into a CUDA graph (the Trainer issues its "
               "collectives outside the graphs)",
               what);
    // After everything queued so far on the compute stream.
    check(cudaEventRecord(compute_ready_, cuda::compute_stream()), "recording the compute stream's event");
    check(cudaStreamWaitEvent(stream_, compute_ready_, 0), "ordering the communication stream");
    {
      const cuda::TimedLaunch timed(what, stream_, "communication stream");  // for a step trace
      settle(launch(), what);
    }
    auto work = std::make_unique<NcclWork>();
    work->communicator = this;
    work->what = std::move(what);
    check(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming), "creating an event");
    check(cudaEventRecord(work->done, stream_), "recording the communication stream's event");
    return work;
  }

  // Host values through the scalars' device buffer, in place, and back; blocking.
  void host_round_trip(const std::string& what, size_t count, ReduceOp op) {
    throw_if_broken();
    check(cudaMemcpyAsync(scalars_, host_scalars_, count * sizeof(double), cudaMemcpyHostToDevice, stream_),
          "copying scalars to the GPU");
    settle(ncclAllReduce(scalars_, scalars_, count, ncclFloat64, op == ReduceOp::Sum ? ncclSum : ncclMax, comm_,
                         stream_),
           what);
    check(cudaMemcpyAsync(host_scalars_, scalars_, count * sizeof(double), cudaMemcpyDeviceToHost, stream_),
          "copying scalars from the GPU");
    NcclWork work;
    work.communicator = this;
    work.what = what;
    check(cudaEventCreateWithFlags(&work.done, cudaEventDisableTiming), "creating an event");
    check(cudaEventRecord(work.done, stream_), "recording the communication stream's event");
    work.wait();
  }

  // A non-blocking communicator answers ncclInProgress until the call has taken effect: poll its
  // state, bounded by the timeout.
  void settle(ncclResult_t result, const std::string& what) {
    const auto deadline = Clock::now() + timeout_;
    for (int polls = 0; result == ncclInProgress; ++polls) {
      if (Clock::now() > deadline)
        abort_and_fail(what, fmt::format("NCCL still in progress after {} (--distributed-timeout-minutes)",
                                         minutes(timeout_)),
                       true);
      pause_between_polls(polls);
      if (comm_) ncclCommGetAsyncError(comm_, &result);
    }
    if (result != ncclSuccess) abort_and_fail(what, nccl_error(result), remote_fault(result));
  }

  // NCCL's errors that another rank may cause: a remote peer's failure, the network or system.
  static bool remote_fault(ncclResult_t result) { return result == ncclRemoteError || result == ncclSystemError; }

  std::string nccl_error(ncclResult_t result) const {
    const char* detail = comm_ ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    return fmt::format("{}{}{}", ncclGetErrorString(result), detail && *detail ? ": " : "", detail ? detail : "");
  }

  // `peer_fault`: communicator.h, FailureExplainer.
  [[noreturn]] void abort_and_fail(const std::string& what, const std::string& reason, bool peer_fault) {
    const std::string culprit = explain_failure_ ? explain_failure_(peer_fault) : "";
    failure_ = fmt::format(
        "nccl {} on rank {} of {} failed: {}{}; the communicator was aborted (a rank died, hung or was stopped: "
        "NCCL reports a lost peer as an error, a hung one runs into --distributed-timeout-minutes)",
        what, rank_, world_size_, culprit.empty() ? "" : culprit + ": ", reason);
    if (comm_) ncclCommAbort(std::exchange(comm_, nullptr));
    throw Error(*failure_);
  }

  void throw_if_broken() const {
    if (failure_) throw Error(*failure_);
  }

  void check(cudaError_t status, const char* what) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    const std::string reason = fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(status));
    if (!comm_) fail("nccl on rank {} of {}: {}", rank_, world_size_, reason);
    abort_and_fail(what, reason, false);
  }

  void check_device(const Tensor& data, const char* operation) const {
    KILN_CHECK(data.device == Device::CUDA,
               "nccl {}: the buffer is in host memory; the nccl backend reduces GPU memory (use "
               "--distributed-backend gloo with --device cpu)",
               operation);
  }

  void check_shards(const Tensor& data, const char* operation) const {
    KILN_CHECK(data.numel() % world_size_ == 0, "nccl {}: {} elements do not split into {} equal shards", operation,
               data.numel(), world_size_);
  }

  const int rank_, world_size_;
  const std::chrono::milliseconds timeout_;
  FailureExplainer explain_failure_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  void* scalars_ = nullptr;  // kMaxHostScalars doubles on the GPU
  double host_scalars_[kMaxHostScalars] = {};
  std::optional<std::string> failure_;
};

NcclWork::~NcclWork() {
  if (done) cudaEventDestroy(done);
}

void NcclWork::wait() {
  if (finished) return;
  communicator->wait_for(done, what);
  finished = true;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world_size, int device, StoreClient& store,
                                                     std::chrono::milliseconds timeout,
                                                     FailureExplainer explain_failure) {
  return std::make_unique<NcclCommunicator>(rank, world_size, device, store, timeout, std::move(explain_failure));
}

}  // namespace kiln
