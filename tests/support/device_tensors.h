// Test helpers: host data <-> back-end memory, poisoning, and normalised error.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/core/rng.h"

namespace kiln::testing {

// Owns back-end buffers for the duration of one op call; hands out Tensor views.
class DeviceTensors {
 public:
  explicit DeviceTensors(Backend& backend) : backend_(backend) {}

  template <typename T>
  Tensor upload(const std::vector<T>& host, Shape shape, DType dtype) {
    buffers_.push_back(backend_.allocate(host.size() * sizeof(T)));
    backend_.copy_to_device(buffers_.back()->data(), host.data(), host.size() * sizeof(T));
    return Tensor{buffers_.back()->data(), shape, dtype, backend_.device()};
  }
  Tensor floats(const std::vector<float>& host, Shape shape) { return upload(host, shape, DType::F32); }
  Tensor ints(const std::vector<int32_t>& host, Shape shape) { return upload(host, shape, DType::I32); }
  // An output buffer filled with NaN, so elements the op forgets to write are caught.
  Tensor poisoned(Shape shape) {
    return floats(std::vector<float>(static_cast<size_t>(shape.numel()), std::numeric_limits<float>::quiet_NaN()), shape);
  }
  std::vector<float> download(const Tensor& tensor) {
    std::vector<float> host(static_cast<size_t>(tensor.numel()));
    backend_.copy_to_host(host.data(), tensor.data, tensor.bytes());
    return host;
  }

 private:
  Backend& backend_;
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

}  // namespace kiln::testing
