// Argument checks shared by the back-ends' op implementations: every op validates dtype, device
// and shape of its inputs and throws a kiln::Error naming the op and the argument.
#pragma once

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::checks {

inline void require(const Tensor& tensor, DType dtype, Device device, const char* op, const char* arg) {
  KILN_CHECK(!tensor.empty(), "{}: argument '{}' is missing", op, arg);
  KILN_CHECK(tensor.device == device, "{}: argument '{}' is in {} memory, expected {}", op, arg,
             tensor.device == Device::CPU ? "host" : "CUDA device",
             device == Device::CPU ? "host" : "CUDA device");
  KILN_CHECK(tensor.dtype == dtype, "{}: argument '{}' has dtype {}, expected {}", op, arg,
             dtype_name(tensor.dtype), dtype_name(dtype));
}

inline void require_numel(const Tensor& tensor, int64_t numel, const char* op, const char* arg) {
  KILN_CHECK(tensor.numel() == numel, "{}: argument '{}' has {} elements {}, expected {}", op, arg,
             tensor.numel(), tensor.shape.to_string(), numel);
}

}  // namespace kiln::checks
