// Tensor: a non-owning view of a dense, row-major block of memory: pointer, shape, dtype and the
// device the memory lives on. It never allocates or frees; whoever made the memory (an Arena, a
// flat parameter buffer, a test) owns it and must outlive every view. Copying a Tensor copies the
// view, not the data. An empty Tensor (data == nullptr) stands for "absent" in optional op inputs.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"

namespace kiln {

enum class Device : uint8_t { CPU, CUDA };

struct Shape {
  static constexpr int kMaxDims = 4;
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> sizes) {
    KILN_CHECK(sizes.size() <= kMaxDims, "tensor rank {} exceeds {}", sizes.size(), kMaxDims);
    for (int64_t size : sizes) dims[rank++] = size;
  }
  int64_t operator[](int axis) const { return dims[axis]; }
  int64_t numel() const {
    int64_t count = 1;
    for (int axis = 0; axis < rank; ++axis) count *= dims[axis];
    return count;
  }
  bool operator==(const Shape& other) const {
    if (rank != other.rank) return false;
    for (int axis = 0; axis < rank; ++axis)
      if (dims[axis] != other.dims[axis]) return false;
    return true;
  }
  std::string to_string() const {
    std::string text = "[";
    for (int axis = 0; axis < rank; ++axis) {
      if (axis) text += ", ";
      text += std::to_string(dims[axis]);
    }
    return text + "]";
  }
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // A view of the same memory under another shape with the same element count.
  Tensor reshaped(Shape new_shape) const {
    KILN_CHECK(new_shape.numel() == numel(), "cannot view {} as {}", shape.to_string(),
               new_shape.to_string());
    Tensor view = *this;
    view.shape = new_shape;
    return view;
  }
  // A view of `count` elements starting at element `offset`, as a 1-D tensor.
  Tensor slice(int64_t offset, int64_t count) const {
    KILN_CHECK(offset >= 0 && count >= 0 && offset + count <= numel(),
               "slice [{}, {}) out of range for {} elements", offset, offset + count, numel());
    Tensor view = *this;
    view.data = static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
    view.shape = Shape{count};
    return view;
  }
};

}  // namespace kiln
