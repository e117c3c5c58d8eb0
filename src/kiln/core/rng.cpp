#include "kiln/core/rng.h"

#include <bit>
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
  // Four lanes of eight-byte words, each word folded in with XXH64's round (xxHash specification,
  // Y. Collet: lane = rotl(lane + word * P2, 31) * P1), so the lanes' multiplies overlap; the
  // lanes and the tail are then combined through mix64.
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  const auto round = [](uint64_t lane, uint64_t word) { return std::rotl(lane + word * kP2, 31) * kP1; };
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t a = mix64(size), b = mix64(size + 1), c = mix64(size + 2), d = mix64(size + 3);
  size_t at = 0;
  for (; at + 32 <= size; at += 32) {
    uint64_t words[4];
    std::memcpy(words, bytes + at, 32);
    a = round(a, words[0]);
    b = round(b, words[1]);
    c = round(c, words[2]);
    d = round(d, words[3]);
  }
  uint64_t tail[4] = {0, 0, 0, 0};
  if (size > at) std::memcpy(tail, bytes + at, size - at);  // (data may be null when size is 0)
  return mix64(mix64(a ^ tail[0]) ^ mix64(b ^ tail[1]) * 3 ^ mix64(c ^ tail[2]) * 5 ^ mix64(d ^ tail[3]) * 7);
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
