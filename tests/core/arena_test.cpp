#include "kiln/core/arena.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "kiln/core/error.h"

namespace kiln {
namespace {

TEST(Arena, AlignsPiecesAndCountsUse) {
  Arena arena(1000);
  auto* first = static_cast<char*>(arena.allocate(10));
  auto* second = static_cast<char*>(arena.allocate(100));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % Arena::kAlignment, 0u);
  EXPECT_EQ(second - first, 64);
  EXPECT_EQ(arena.used(), 64u + 128u);
  arena.reset();
  EXPECT_EQ(arena.allocate(1), first);
}

TEST(Arena, ExhaustionIsAnError) {
  Arena arena(128);
  arena.allocate(64);
  EXPECT_THROW(arena.allocate(65), Error);
}

TEST(Arena, MeasuringCountsWithoutMemory) {
  Arena measure = Arena::measuring();
  EXPECT_EQ(measure.allocate(1), nullptr);
  measure.allocate(65);
  EXPECT_EQ(measure.used(), 64u + 128u);
}

TEST(Arena, BorrowedMemory) {
  alignas(64) char block[256];
  Arena arena(block, sizeof(block));
  EXPECT_EQ(arena.allocate(10), block);
  EXPECT_EQ(arena.allocate(10), block + 64);
}

}  // namespace
}  // namespace kiln
