// Host-callable queries about CUDA devices, compiled by nvcc in CUDA builds only. Plain C++ types
// in the interface so host code does not include CUDA headers.
#pragma once

#include <string>

namespace kiln::cuda {

int visible_device_count();     // 0 when the driver reports no device or an error
std::string no_device_reason(); // the driver's words for why there is no device

}  // namespace kiln::cuda
