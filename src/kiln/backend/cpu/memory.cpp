// Host memory for the CPU back-end: 64-byte aligned, owned by a DeviceBuffer.
#include <cstdlib>
#include <cstring>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/core/arena.h"

namespace kiln {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    data_ = std::aligned_alloc(Arena::kAlignment, Arena::aligned(bytes ? bytes : 1));
    KILN_CHECK(data_ != nullptr, "out of host memory: could not allocate {} bytes", bytes);
  }
  ~HostBuffer() override { std::free(data_); }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceBuffer> CpuBackend::allocate(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void CpuBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(device_dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, device_src, bytes);
}

}  // namespace kiln
