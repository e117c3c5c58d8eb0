#include "kiln/core/arena.h"

#include <cstdlib>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln {

void Arena::Free::operator()(void* memory) const { std::free(memory); }

Arena::Arena(size_t capacity_bytes) : capacity_(aligned(capacity_bytes)) {
  if (capacity_ == 0) return;
  void* memory = std::aligned_alloc(kAlignment, capacity_);
  KILN_CHECK(memory != nullptr, "out of host memory: could not allocate {} bytes", capacity_);
  memory_.reset(memory);
}

Arena::Arena(void* base, size_t capacity_bytes) : borrowed_(base), capacity_(capacity_bytes) {
  KILN_CHECK(base != nullptr || capacity_bytes == 0, "arena over a null buffer of {} bytes",
             capacity_bytes);
}

Arena Arena::measuring() {
  Arena arena;
  arena.measuring_ = true;
  return arena;
}

void* Arena::allocate(size_t bytes) {
  const size_t size = aligned(bytes);
  if (measuring_) {
    used_ += size;
    return nullptr;
  }
  KILN_CHECK(used_ + size <= capacity_,
             "arena exhausted: {} bytes requested with {} of {} used (activation plan is wrong)",
             size, used_, capacity_);
  char* base = memory_ ? static_cast<char*>(memory_.get()) : static_cast<char*>(borrowed_);
  void* piece = base + used_;
  used_ += size;
  return piece;
}

}  // namespace kiln
