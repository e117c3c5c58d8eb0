// Counts the bytes a back-end holds in buffers, current and peak. Not thread-safe, like Backend.
#pragma once

#include <algorithm>
#include <cstddef>

namespace kiln {

class MemoryTracker {
 public:
  void allocated(size_t bytes) {
    current_ += bytes;
    peak_ = std::max(peak_, current_);
  }
  void freed(size_t bytes) { current_ -= bytes; }
  size_t current() const { return current_; }
  size_t peak() const { return peak_; }

 private:
  size_t current_ = 0, peak_ = 0;
};

}  // namespace kiln
