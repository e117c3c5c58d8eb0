// Host memory shared by an emulated kernel (cuda_emulator.h) and the CPU reference: a 256-byte
// aligned buffer of one dtype with a guard band after it, so a kernel that writes past its output
// is caught (guard_intact), plus the comparisons the emulator tests make.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/tensor.h"
#include "support/device_tensors.h"

namespace kiln::testing {

class HostTensor {
 public:
  // `values` rounded to `dtype` (any floating dtype).
  HostTensor(DType dtype, Shape shape, const std::vector<float>& values)
      : HostTensor(dtype, shape) {
    narrow_from_fp32(values.data(), dtype, data(), static_cast<int64_t>(values.size()));
  }
  static HostTensor ints(Shape shape, const std::vector<int32_t>& values) {
    HostTensor tensor(DType::I32, shape);
    std::memcpy(tensor.data(), values.data(), values.size() * sizeof(int32_t));
    return tensor;
  }
  // Every element NaN, so an element a kernel forgets to write is caught.
  static HostTensor poisoned(DType dtype, Shape shape) {
    return HostTensor(dtype, shape, std::vector<float>(static_cast<size_t>(shape.numel()), NAN));
  }

  void* data() const { return memory_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  Tensor view() const { return Tensor{data(), shape_, dtype_, Device::CPU}; }
  std::vector<float> floats() const {
    std::vector<float> values(static_cast<size_t>(shape_.numel()));
    widen_to_fp32(data(), dtype_, values.data(), shape_.numel());
    return values;
  }
  bool guard_intact() const {
    const auto* guard = static_cast<const unsigned char*>(data()) + bytes_;
    return std::all_of(guard, guard + kGuardBytes,
                       [](unsigned char byte) { return byte == kGuardByte; });
  }

 private:
  static constexpr size_t kGuardBytes = 64;
  static constexpr unsigned char kGuardByte = 0x5A;
  struct Free {
    void operator()(unsigned char* memory) const {
      ::operator delete[](memory, std::align_val_t{256});
    }
  };

  HostTensor(DType dtype, Shape shape)
      : dtype_(dtype),
        shape_(shape),
        bytes_(static_cast<size_t>(shape.numel()) * dtype_size(dtype)),
        memory_(static_cast<unsigned char*>(
            ::operator new[](bytes_ + kGuardBytes, std::align_val_t{256}))) {
    std::memset(memory_.get() + bytes_, kGuardByte, kGuardBytes);
  }

  DType dtype_;
  Shape shape_;
  size_t bytes_;
  std::unique_ptr<unsigned char[], Free> memory_;
};

// The kernels' element kind (kernels.h) of a floating dtype.
inline int element_kind(DType dtype) {
  return dtype == DType::BF16 ? cuda::kBf16 : dtype == DType::F16 ? cuda::kFp16 : cuda::kFp32;
}

// A launcher's status as a test assertion, once the compute stream has run what it issued: 0, or
// the emulator's account of what went wrong.
inline ::testing::AssertionResult launched(int status) {
  if (status == 0) status = cudaStreamSynchronize(cuda::compute_stream());
  if (status == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status " << status << ": " << cuda_emulator::failure();
}

}  // namespace kiln::testing
