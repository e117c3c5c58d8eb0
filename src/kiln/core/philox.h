// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel Random
// Numbers: As Easy as 1, 2, 3" (SC11, 2011): a keyed bijection of a 128-bit counter, so the
// random bits of element i depend only on (key, i) and any thread can draw any element's bits
// without a state to carry. This is what dropout needs (ARCHITECTURE.md, core/): activation
// recomputation replays the very mask, a resumed run draws the same masks, ranks differ by key,
// and the CPU reference draws the same bits as the CUDA kernels.
//
// Ten rounds of: two 32x32->64-bit products of the counter's words 0 and 2 by the multipliers
// 0xD2511F53 and 0xCD9E8D57; the new words are (hi(c2*M1) ^ c1 ^ k0, lo(c2*M1), hi(c0*M0) ^ c3 ^
// k1, lo(c0*M0)); the key is bumped by the Weyl constants 0x9E3779B9 and 0xBB67AE85 between
// rounds. Checked against the paper's Random123 known-answer vectors (tests/core/philox_test.cpp).
// Header-only and usable on both sides (host and CUDA device code).
#pragma once

#include <cstdint>

#include "kiln/core/host_device.h"

namespace kiln::philox {

struct Words {
  uint32_t w[4];
};

KILN_HOST_DEVICE inline Words philox4x32_10(Words counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter.w[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter.w[2];
    counter = Words{{static_cast<uint32_t>(product1 >> 32) ^ counter.w[1] ^ key0, static_cast<uint32_t>(product1),
                     static_cast<uint32_t>(product0 >> 32) ^ counter.w[3] ^ key1, static_cast<uint32_t>(product0)}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// Block `block` of the stream (key, stream): the counter (block in words 0-1, `stream` in words
// 2-3) under the key; its four words are the bits of elements 4 block .. 4 block + 3.
KILN_HOST_DEVICE inline Words block(uint64_t key, uint64_t stream, uint64_t block) {
  return philox4x32_10(Words{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                              static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}},
                       static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// The 32 random bits of element `index` of the stream (key, stream): word index % 4 of block
// index / 4. A loop over consecutive elements draws a block once for four of them (block()).
KILN_HOST_DEVICE inline uint32_t bits(uint64_t key, uint64_t stream, uint64_t index) {
  return block(key, stream, index >> 2).w[index & 3];
}

}  // namespace kiln::philox
