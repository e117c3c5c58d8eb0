// The CPU back-end's BatchStager: device memory is host memory, so a slot's host buffer is also
// its "device" buffer; submit() copies nothing and the waits have nothing to wait for.
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

class HostBatchStager final : public BatchStager {
 public:
  explicit HostBatchStager(const StagerOptions& options) : slots_(static_cast<size_t>(options.slots)) {
    KILN_CHECK(options.slots >= 2, "batch stager: needs at least 2 slots, got {}", options.slots);
    for (auto& slot : slots_) slot.resize(options.ints_per_batch);
  }
  std::span<int32_t> next_host_slot() override {
    current_ = (current_ + 1) % slots_.size();
    return slots_[current_];
  }
  const int32_t* submit() override { return slots_[current_].data(); }
  void wait_for_copy(const int32_t*) override {}
  void release(const int32_t*) override {}
  size_t host_bytes() const override { return slots_.size() * slots_.front().size() * sizeof(int32_t); }
  size_t device_bytes() const override { return 0; }

 private:
  std::vector<std::vector<int32_t>> slots_;
  size_t current_ = 0;
};

}  // namespace

std::unique_ptr<BatchStager> CpuBackend::make_batch_stager(const StagerOptions& options) {
  return std::make_unique<HostBatchStager>(options);
}

}  // namespace kiln
