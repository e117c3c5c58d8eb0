#include "kiln/core/rng.h"

#include <cmath>
#include <cstring>
#include <numbers>

namespace kiln {

uint64_t mix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

uint64_t hash_string(std::string_view text) {
  uint64_t hash = 0x6b696c6e;  // "kiln"
  for (char c : text) hash = mix64(hash ^ static_cast<uint8_t>(c));
  return hash;
}

uint64_t hash_bytes(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t hash = mix64(0x6b696c6e ^ size);
  size_t at = 0;
  for (; at + 8 <= size; at += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + at, 8);
    hash = mix64(hash ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + at, size - at);
  return mix64(hash ^ tail);
}

Rng::Rng(uint64_t seed) {
  uint64_t stream = seed;
  for (uint64_t& word : state_) {
    stream += 0x9e3779b97f4a7c15ull;
    word = mix64(stream);
  }
}

static uint64_t rotate_left(uint64_t value, int bits) { return (value << bits) | (value >> (64 - bits)); }

uint64_t Rng::next_u64() {
  const uint64_t result = rotate_left(state_[1] * 5, 7) * 9;
  const uint64_t shifted = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= shifted;
  state_[3] = rotate_left(state_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

float Rng::normal(float mean, float stddev) {
  // Box-Muller with u1 in (0, 1] so log() is finite.
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  return mean + stddev * static_cast<float>(radius * std::cos(2.0 * std::numbers::pi * u2));
}

uint64_t Rng::below(uint64_t bound) {
  // Lemire's multiply-shift with rejection, unbiased.
  while (true) {
    const unsigned __int128 product = static_cast<unsigned __int128>(next_u64()) * bound;
    const uint64_t low = static_cast<uint64_t>(product);
    if (low >= bound || low >= (-bound) % bound) return static_cast<uint64_t>(product >> 64);
  }
}

}  // namespace kiln
