#include "kiln/backend/cpu/fp32_scope.h"

#include <cstdint>

#include "kiln/core/error.h"

namespace kiln {

float* ConversionScratch::take(size_t count) {
  if (used_ == buffers_.size()) buffers_.emplace_back();
  std::vector<float>& buffer = buffers_[used_++];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

void Fp32Scope::write_back() {
  for (const Pending& pending : outputs_)
    narrow_from_fp32(pending.fp32.as<float>(), pending.original.dtype, pending.original.data, pending.original.numel());
  outputs_.clear();
}

bool Fp32Scope::passes_through(const Tensor& tensor) {
  return tensor.empty() || (tensor.dtype != DType::BF16 && tensor.dtype != DType::F16);
}

Tensor Fp32Scope::widened(const Tensor& tensor, bool copy_values) {
  Tensor view = tensor;
  view.dtype = DType::F32;
  view.data = scratch_.take(static_cast<size_t>(tensor.numel()));
  if (copy_values) widen_to_fp32(tensor.data, tensor.dtype, view.as<float>(), tensor.numel());
  return view;
}

Tensor Fp32Scope::input(const Tensor& tensor) {
  if (passes_through(tensor)) return tensor;
  return widened(tensor, true);
}

Tensor Fp32Scope::output(const Tensor& tensor) {
  if (passes_through(tensor)) return tensor;
  Tensor view = widened(tensor, false);
  outputs_.push_back({view, tensor});
  return view;
}

Tensor Fp32Scope::accumulated(const Tensor& tensor) {
  if (passes_through(tensor)) return tensor;
  Tensor view = widened(tensor, true);
  outputs_.push_back({view, tensor});
  return view;
}

}  // namespace kiln
