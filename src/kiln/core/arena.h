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
// ArenaOverlay lays pieces whose lifetimes never overlap over one stretch of the arena.
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
  friend class ArenaOverlay;
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

// Alternatives over one stretch of an arena: the pieces taken after next() start again where the
// first alternative's did, and finish() moves the arena past the longest alternative. The caller
// promises that no piece of one alternative is in use while a piece of another is (the activation
// plan's scratch shared between forward and backward). Pieces taken before or after stay apart.
class ArenaOverlay {
 public:
  explicit ArenaOverlay(Arena& arena) : arena_(arena), start_(arena.used_), end_(arena.used_) {}
  void next() {
    end_ = end_ > arena_.used_ ? end_ : arena_.used_;
    arena_.used_ = start_;
  }
  void finish() {
    next();
    arena_.used_ = end_;
  }

 private:
  Arena& arena_;
  size_t start_, end_;
};

}  // namespace kiln
