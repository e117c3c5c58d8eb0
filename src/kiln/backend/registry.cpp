#include "kiln/backend/registry.h"

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/core/error.h"

#ifdef KILN_WITH_CUDA
#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/device_query.h"
#endif

namespace kiln {

int cuda_device_count() {
#ifdef KILN_WITH_CUDA
  return cuda::visible_device_count();
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef KILN_WITH_CUDA
  return cuda::visible_device_count() > 0 ? std::string() : cuda::no_device_reason();
#else
  return "this kiln was built without CUDA (nvcc was not found at configure time)";
#endif
}

std::unique_ptr<Backend> make_backend(std::string_view device_name, const BackendOptions& options) {
  if (device_name == "cpu") {
    KILN_CHECK(!options.tf32, "TF32 is a CUDA tensor-core mode; the CPU back-end has none");
    return std::make_unique<CpuBackend>();
  }
  if (device_name == "cuda") {
    const std::string reason = cuda_unavailable_reason();
    KILN_CHECK(reason.empty(), "device 'cuda' is not available: {}", reason);
#ifdef KILN_WITH_CUDA
    return std::make_unique<CudaBackend>(options);
#endif
  }
  fail("unknown device '{}' (expected cpu or cuda)", device_name);
}

}  // namespace kiln
