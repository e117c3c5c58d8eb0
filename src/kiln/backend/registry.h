// Choosing a back-end by device name. "cpu" always exists. "cuda" exists in builds configured
// with the CUDA toolkit, on machines where a GPU is visible; asking for it elsewhere is a clear
// error naming the reason, never a silent CPU fallback.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kiln/backend/backend.h"

namespace kiln {

std::unique_ptr<Backend> make_backend(std::string_view device_name, const BackendOptions& options = {});

// Number of CUDA devices visible (0 in builds without CUDA or with no GPU), and why none when 0.
int cuda_device_count();
std::string cuda_unavailable_reason();

}  // namespace kiln
