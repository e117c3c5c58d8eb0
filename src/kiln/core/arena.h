// Arena: one allocation made up front, handed out in aligned pieces by bumping an offset.
// Used for activation memory: the planner sizes the arena from the configuration before the
// first step, so steady-state training never allocates. Pieces are never freed individually;
// reset() forgets them all. Not thread-safe. Exhaustion is a kiln::Error naming both sizes,
// which means the plan and the use disagree (a bug), never a silent over-allocation.
//
// The memory is either owned (host) or borrowed from a back-end buffer (device memory), so the
// same planner serves every back-end.
// An Arena built with `Arena::measuring()` owns no memory: allocate() only counts bytes and
// returns null, so the same code that lays memory out can first measure it.
#pragma once

#include <cstddef>
#include <memory>

namespace kiln {

class Arena {
 public:
  // 256 bytes: the most any cuBLASLt kernel asks of a matrix (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*),
  // so every activation qualifies for the fastest algorithms, wherever the plan puts it.
  static constexpr size_t kAlignment = 256;

  explicit Arena(size_t capacity_bytes);   // owns host memory
  Arena(void* base, size_t capacity_bytes); // hands out memory it does not own (device memory)
  static Arena measuring();

  void* allocate(size_t bytes);
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  bool is_measuring() const { return measuring_; }

  static size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  Arena() = default;
  struct Free {
    void operator()(void* memory) const;
  };
  std::unique_ptr<void, Free> memory_;
  void* borrowed_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  bool measuring_ = false;
};

}  // namespace kiln
