// Argument checks shared by the CPU op files: every op validates dtype, device and shape of its
// inputs and throws a kiln::Error naming the op and the argument.
#pragma once

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::cpu {

inline void require(const Tensor& tensor, DType dtype, const char* op, const char* arg) {
  KILN_CHECK(!tensor.empty(), "{}: argument '{}' is missing", op, arg);
  KILN_CHECK(tensor.device == Device::CPU, "{}: argument '{}' is not in host memory", op, arg);
  KILN_CHECK(tensor.dtype == dtype, "{}: argument '{}' has dtype {}, expected {}", op, arg,
             dtype_name(tensor.dtype), dtype_name(dtype));
}

inline void require_numel(const Tensor& tensor, int64_t numel, const char* op, const char* arg) {
  KILN_CHECK(tensor.numel() == numel, "{}: argument '{}' has {} elements {}, expected {}", op, arg,
             tensor.numel(), tensor.shape.to_string(), numel);
}

}  // namespace kiln::cpu
