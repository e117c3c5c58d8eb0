// The CUDA back-end's BatchStager (batch_stager.h): page-locked host slots (cudaHostAlloc) or
// pageable ones, device slots from cudaMalloc, and per slot two events: `copied` (recorded on the
// copy stream after the slot's host-to-device copy) and `free` (recorded on the compute stream
// after the last kernel that read the slot). The ops run on the compute stream (stream.h), the
// copies on a non-blocking stream of the stager's own (own_stream), ordered against the ops by
// the events, or else on the compute stream itself, in line with the ops.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

using cuda::check_cuda;

class CudaBatchStager final : public BatchStager {
 public:
  explicit CudaBatchStager(const StagerOptions& options) : options_(options) {
    KILN_CHECK(options.slots >= 2, "batch stager: needs at least 2 slots, got {}", options.slots);
    const size_t bytes = options.ints_per_batch * sizeof(int32_t);
    if (options.own_stream)
      check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                 "batch stager stream");
    slots_.resize(static_cast<size_t>(options.slots));
    for (Slot& slot : slots_) {
      if (options.pinned) {
        check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&slot.host), bytes ? bytes : 1,
                                 cudaHostAllocDefault),
                   "batch stager pinned host allocation");
      } else {
        slot.host = static_cast<int32_t*>(std::malloc(bytes ? bytes : 1));
        KILN_CHECK(slot.host != nullptr, "out of host memory: {} bytes for a batch slot", bytes);
      }
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&slot.device), bytes ? bytes : 1),
                 "batch stager device allocation");
      check_cuda(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming),
                 "batch stager event");
      check_cuda(cudaEventCreateWithFlags(&slot.free, cudaEventDisableTiming),
                 "batch stager event");
    }
  }
  ~CudaBatchStager() override {
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    cudaDeviceSynchronize();
    for (Slot& slot : slots_) {
      if (options_.pinned) {
        cudaFreeHost(slot.host);
      } else {
        std::free(slot.host);
      }
      cudaFree(slot.device);
      cudaEventDestroy(slot.copied);
      cudaEventDestroy(slot.free);
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  std::span<int32_t> next_host_slot() override {
    current_ = (current_ + 1) % slots_.size();
    Slot& slot = slots_[current_];
    if (slot.used)
      check_cuda(cudaEventSynchronize(slot.copied), "batch stager wait for the slot's last copy");
    return {slot.host, options_.ints_per_batch};
  }

  const int32_t* submit() override {
    Slot& slot = slots_[current_];
    cudaStream_t stream = copy_stream_ ? copy_stream_ : cuda::compute_stream();
    if (slot.used && copy_stream_)
      check_cuda(cudaStreamWaitEvent(copy_stream_, slot.free, 0),
                 "batch stager wait for a free slot");
    {
      // On the copy stream, a track of its own in a step trace; a copy on the compute stream is
      // left out, as it would fall inside the next op's device work.
      std::optional<cuda::TimedLaunch> timed;
      if (copy_stream_ && cuda::launch_timing())
        timed.emplace("host-to-device copy of a micro-batch", copy_stream_, "copy stream");
      check_cuda(cudaMemcpyAsync(slot.device, slot.host, options_.ints_per_batch * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream),
                 "batch stager host-to-device copy");
    }
    check_cuda(cudaEventRecord(slot.copied, stream), "batch stager event record");
    slot.used = true;
    return slot.device;
  }

  void wait_for_copy(const int32_t* device) override {
    if (copy_stream_)
      check_cuda(cudaStreamWaitEvent(cuda::compute_stream(), find(device).copied, 0),
                 "batch stager wait for a copy");
  }

  void release(const int32_t* device) override {
    check_cuda(cudaEventRecord(find(device).free, cuda::compute_stream()),
               "batch stager event record");
  }

  size_t host_bytes() const override { return slots_.size() * options_.ints_per_batch * sizeof(int32_t); }
  size_t device_bytes() const override { return host_bytes(); }

 private:
  struct Slot {
    int32_t* host = nullptr;
    int32_t* device = nullptr;
    cudaEvent_t copied = nullptr, free = nullptr;
    bool used = false;
  };
  Slot& find(const int32_t* device) {
    for (Slot& slot : slots_)
      if (slot.device == device) return slot;
    fail("batch stager: {} is not one of its device slots", static_cast<const void*>(device));
  }

  StagerOptions options_;
  cudaStream_t copy_stream_ = nullptr;
  std::vector<Slot> slots_;
  size_t current_ = 0;
};

}  // namespace

std::unique_ptr<BatchStager> CudaBackend::make_batch_stager(const StagerOptions& options) {
  return std::make_unique<CudaBatchStager>(options);
}

}  // namespace kiln
