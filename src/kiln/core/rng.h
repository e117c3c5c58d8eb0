// Deterministic random numbers that can be saved and restored exactly.
//
// Rng is xoshiro256** (Blackman & Vigna, "Scrambled linear pseudorandom number generators",
// 2018) seeded through splitmix64; its whole state is four 64-bit words, which checkpoints store.
// normal() uses Box-Muller and caches nothing, so the state alone determines the stream.
// mix64() is splitmix64's finaliser: a stateless hash used to derive independent streams from a
// (seed, index) pair, e.g. the i-th training sample, so order does not depend on thread count.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

uint64_t mix64(uint64_t value);
// A 64-bit hash of a string built from mix64, for cache file names (not for security).
uint64_t hash_string(std::string_view text);
// A 64-bit hash of bytes (eight-byte words in four interleaved lanes, finished with mix64): a
// checksum that finds damage in checkpoints and caches, not for security.
uint64_t hash_bytes(const void* data, size_t size);

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t next_u64();
  float uniform();                   // [0, 1)
  float normal(float mean, float stddev);
  uint64_t below(uint64_t bound);    // uniform integer in [0, bound), bound > 0

  std::array<uint64_t, 4> state() const { return state_; }
  void set_state(const std::array<uint64_t, 4>& state) { state_ = state; }

 private:
  std::array<uint64_t, 4> state_{};
};

}  // namespace kiln
