#include "kiln/core/philox.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>

namespace kiln {
namespace {

std::array<uint32_t, 4> run(std::array<uint32_t, 4> counter, uint32_t key0, uint32_t key1) {
  const philox::Words out = philox::philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}}, key0, key1);
  return {out.w[0], out.w[1], out.w[2], out.w[3]};
}

// Random123's tests/kat_vectors, the three "philox4x32 10" lines (counter, key, result).
TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(run({0, 0, 0, 0}, 0, 0), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(run({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(run({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, ElementBitsAreTheBlocksWordsInOrder) {
  const uint64_t key = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
  for (uint64_t block : {uint64_t{0}, uint64_t{1}, uint64_t{0x1'0000'0002}}) {
    const auto words = run({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                            static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                           static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
    for (uint64_t word = 0; word < 4; ++word) EXPECT_EQ(philox::bits(key, stream, 4 * block + word), words[word]);
  }
}

// Each bit of the stream is fair, and streams differ: over 2^16 draws, every bit's share of ones
// and the share of draws equal between two neighbouring streams are as chance would have them.
TEST(Philox, BitsAreFairAndStreamsIndependent) {
  constexpr int kDraws = 1 << 16;
  std::array<int, 32> ones{};
  int same = 0;
  for (int i = 0; i < kDraws; ++i) {
    const uint32_t value = philox::bits(42, 7, static_cast<uint64_t>(i));
    for (int bit = 0; bit < 32; ++bit) ones[bit] += (value >> bit) & 1u;
    same += (value & 1u) == (philox::bits(42, 8, static_cast<uint64_t>(i)) & 1u);
  }
  const double sigma = std::sqrt(kDraws * 0.25);  // of a binomial count with p = 1/2
  for (int bit = 0; bit < 32; ++bit) EXPECT_LT(std::abs(ones[bit] - kDraws / 2), 5 * sigma) << "bit " << bit;
  EXPECT_LT(std::abs(same - kDraws / 2), 5 * sigma);
}

}  // namespace
}  // namespace kiln
