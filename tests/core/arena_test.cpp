#include "kiln/core/arena.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "kiln/core/error.h"

namespace kiln {
namespace {

TEST(Arena, AlignsPiecesAndCountsUse) {
  Arena arena(1000);
  auto* first = static_cast<char*>(arena.allocate(10));
  auto* second = static_cast<char*>(arena.allocate(300));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % Arena::kAlignment, 0u);
  EXPECT_EQ(second - first, 256);
  EXPECT_EQ(arena.used(), 256u + 512u);
  arena.reset();
  EXPECT_EQ(arena.allocate(1), first);
}

TEST(Arena, ExhaustionIsAnError) {
  Arena arena(512);
  arena.allocate(256);
  EXPECT_THROW(arena.allocate(257), Error);
}

TEST(Arena, MeasuringCountsWithoutMemory) {
  Arena measure = Arena::measuring();
  EXPECT_EQ(measure.allocate(1), nullptr);
  measure.allocate(257);
  EXPECT_EQ(measure.used(), 256u + 512u);
}

TEST(Arena, BorrowedMemory) {
  alignas(256) char block[1024];
  Arena arena(block, sizeof(block));
  EXPECT_EQ(arena.allocate(10), block);
  EXPECT_EQ(arena.allocate(10), block + 256);
}

}  // namespace
}  // namespace kiln
