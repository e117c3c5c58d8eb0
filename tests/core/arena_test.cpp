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

TEST(Arena, OverlayAlternativesShareMemoryAndTheArenaContinuesAfterTheLongest) {
  Arena arena(4096);
  auto* before = static_cast<char*>(arena.allocate(10));
  ArenaOverlay overlay(arena);
  auto* a = static_cast<char*>(arena.allocate(300));  // alternative 1: 512 bytes
  overlay.next();
  auto* b = static_cast<char*>(arena.allocate(1000));  // alternative 2: 1024 bytes
  auto* b2 = static_cast<char*>(arena.allocate(1));
  overlay.next();
  auto* c = static_cast<char*>(arena.allocate(1));  // alternative 3: 256 bytes
  overlay.finish();
  auto* after = static_cast<char*>(arena.allocate(1));
  EXPECT_EQ(a, before + 256);
  EXPECT_EQ(b, a);
  EXPECT_EQ(c, a);
  EXPECT_EQ(b2, a + 1024);
  EXPECT_EQ(after, a + 1280);  // past the longest alternative (1024 + 256)
  EXPECT_EQ(arena.used(), 256u + 1280u + 256u);
  Arena measure = Arena::measuring();  // measuring counts the same way
  ArenaOverlay counted(measure);
  measure.allocate(300);
  counted.next();
  measure.allocate(1000);
  counted.finish();
  EXPECT_EQ(measure.used(), 1024u);
}

TEST(Arena, BorrowedMemory) {
  alignas(256) char block[1024];
  Arena arena(block, sizeof(block));
  EXPECT_EQ(arena.allocate(10), block);
  EXPECT_EQ(arena.allocate(10), block + 256);
}

}  // namespace
}  // namespace kiln
