// Host memory for the CPU back-end (64-byte aligned, owned by a DeviceBuffer), the back-end's
// description, and the GEMM timing hook.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/core/arena.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  HostBuffer(size_t bytes, std::shared_ptr<MemoryTracker> memory) : bytes_(bytes), memory_(std::move(memory)) {
    data_ = std::aligned_alloc(Arena::kAlignment, Arena::aligned(bytes ? bytes : 1));
    KILN_CHECK(data_ != nullptr, "out of host memory: could not allocate {} bytes", bytes);
    memory_->allocated(bytes_);
  }
  ~HostBuffer() override {
    std::free(data_);
    memory_->freed(bytes_);
  }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<MemoryTracker> memory_;
};

}  // namespace

std::unique_ptr<DeviceBuffer> CpuBackend::allocate(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes, memory_);
}

std::string CpuBackend::description() const {
  // OpenBLAS's kernels for this CPU (its own choice, or OPENBLAS_CORETYPE's): they set the products' speed.
  return fmt::format("cpu, {} threads, OpenBLAS {} kernels", omp_get_max_threads(), openblas_get_corename());
}

double CpuBackend::time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K, int iterations) {
  KILN_CHECK(dtype == DType::F32 && !tf32, "the CPU back-end multiplies fp32 only, not {}{}",
             dtype_name(dtype), tf32 ? " (tf32)" : "");
  KILN_CHECK(M > 0 && N > 0 && K > 0 && iterations > 0, "gemm sizes and iterations must be positive");
  Rng rng(1);
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N)), c(static_cast<size_t>(M * N));
  for (float& value : a) value = rng.normal(0.0f, 1.0f);
  for (float& value : b) value = rng.normal(0.0f, 1.0f);
  std::vector<double> times;
  for (int i = 0; i <= iterations; ++i) {  // the first run warms up and is not counted
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f,
                c.data(), N);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) times.push_back(ms);
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

void CpuBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(device_dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, device_src, bytes);
}

}  // namespace kiln
