// Test helpers: host data <-> back-end memory, poisoning, and normalised error.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/core/rng.h"

namespace kiln::testing {

// `values` rounded to `dtype` (fp32, bf16 or fp16) and back: what a tensor of that dtype holds.
inline std::vector<float> rounded_to(DType dtype, std::vector<float> values) {
  std::vector<char> stored(values.size() * dtype_size(dtype));
  const auto count = static_cast<int64_t>(values.size());
  narrow_from_fp32(values.data(), dtype, stored.data(), count);
  widen_to_fp32(stored.data(), dtype, values.data(), count);
  return values;
}

// Owns back-end buffers for the duration of one op call; hands out Tensor views. Activations
// (acts, poisoned_acts) are stored in the op's compute dtype; floats and poisoned are always fp32
// (parameter gradients, statistics, losses).
class DeviceTensors {
 public:
  explicit DeviceTensors(Backend& backend, DType activations = DType::F32)
      : backend_(backend), activations_(activations) {}

  template <typename T>
  Tensor upload(const std::vector<T>& host, Shape shape, DType dtype) {
    buffers_.push_back(backend_.allocate(host.size() * sizeof(T)));
    backend_.copy_to_device(buffers_.back()->data(), host.data(), host.size() * sizeof(T));
    return Tensor{buffers_.back()->data(), shape, dtype, backend_.device()};
  }
  Tensor floats(const std::vector<float>& host, Shape shape) { return upload(host, shape, DType::F32); }
  Tensor ints(const std::vector<int32_t>& host, Shape shape) { return upload(host, shape, DType::I32); }
  Tensor acts(const std::vector<float>& host, Shape shape) {
    std::vector<char> stored(host.size() * dtype_size(activations_));
    narrow_from_fp32(host.data(), activations_, stored.data(), static_cast<int64_t>(host.size()));
    return upload(stored, shape, activations_);
  }
  // Output buffers filled with NaN, so elements the op forgets to write are caught.
  Tensor poisoned(Shape shape) {
    return floats(std::vector<float>(static_cast<size_t>(shape.numel()), std::numeric_limits<float>::quiet_NaN()), shape);
  }
  Tensor poisoned_acts(Shape shape) {
    return acts(std::vector<float>(static_cast<size_t>(shape.numel()), std::numeric_limits<float>::quiet_NaN()), shape);
  }
  // Any floating tensor, widened to fp32.
  std::vector<float> download(const Tensor& tensor) {
    std::vector<char> stored(tensor.bytes());
    backend_.copy_to_host(stored.data(), tensor.data, tensor.bytes());
    std::vector<float> host(static_cast<size_t>(tensor.numel()));
    widen_to_fp32(stored.data(), tensor.dtype, host.data(), tensor.numel());
    return host;
  }
  DType activations() const { return activations_; }

 private:
  Backend& backend_;
  DType activations_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

inline std::vector<float> random_floats(size_t count, Rng& rng, float scale = 1.0f) {
  std::vector<float> values(count);
  for (float& value : values) value = rng.normal(0.0f, scale);
  return values;
}

// sqrt(sum (a - b)^2 / sum b^2); NaN anywhere in `actual` gives +inf.
template <typename A, typename B>
double normalized_error(const std::vector<A>& actual, const std::vector<B>& expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
    const double b = static_cast<double>(expected[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// normalized_error over the finite entries of `expected`; its infinite entries (the -inf lse of a
// query without keys) must be the same infinity in `actual`.
inline double normalized_error_with_infinities(const std::vector<float>& actual,
                                               const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  std::vector<float> finite_actual, finite_expected;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isinf(expected[i])) {
      if (actual[i] != expected[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    finite_actual.push_back(actual[i]);
    finite_expected.push_back(expected[i]);
  }
  return normalized_error(finite_actual, finite_expected);
}

}  // namespace kiln::testing
