#include "kiln/core/latency_sensitive_thread.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <thread>

namespace kiln {
namespace {

// The scheduler's own record of a thread's slice: /proc/self/task/TID/sched's "se.slice" line, in
// nanoseconds. nullopt where the kernel does not show it (no debug statistics, or no EEVDF).
std::optional<long long> slice_of(long tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/sched");
  std::string line;
  while (std::getline(file, line)) {
    if (!line.starts_with("se.slice")) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) return std::nullopt;
    return std::stoll(line.substr(colon + 1));
  }
  return std::nullopt;
}

long this_thread_id() { return static_cast<long>(syscall(SYS_gettid)); }

// What a thread saw: whether the request was granted, its slice before and after, and the slice
// of a thread it started afterwards.
struct Observed {
  bool granted = false;
  std::optional<long long> before, after, child;
};

Observed request_on_a_fresh_thread(std::chrono::microseconds slice) {
  Observed seen;
  std::thread([&] {
    const long tid = this_thread_id();
    seen.before = slice_of(tid);
    seen.granted = request_short_time_slice(slice);
    seen.after = slice_of(tid);
    std::thread([&] { seen.child = slice_of(this_thread_id()); }).join();
  }).join();
  return seen;
}

TEST(LatencySensitiveThread, AGrantedSliceIsTheSchedulersAndThreadsStartedLaterInheritIt) {
  const Observed seen = request_on_a_fresh_thread(std::chrono::microseconds(100));
  if (!seen.before) GTEST_SKIP() << "this kernel does not show se.slice in /proc/self/task/*/sched";
  if (!seen.granted) {
    // Refused or ignored (Linux before 6.12): nothing may have changed.
    EXPECT_EQ(seen.after, seen.before);
    GTEST_SKIP() << "this kernel keeps its default slice (" << *seen.before << " ns): custom slices need 6.12+";
  }
  EXPECT_EQ(seen.after, 100'000);
  EXPECT_EQ(seen.child, 100'000);
  // The caller's thread (a compute thread) keeps its own slice.
  EXPECT_EQ(slice_of(this_thread_id()), seen.before);
}

TEST(LatencySensitiveThread, EachRequestSetsTheSliceItNames) {
  const Observed short_one = request_on_a_fresh_thread(std::chrono::microseconds(100));
  if (!short_one.before || !short_one.granted) GTEST_SKIP() << "no custom slices on this kernel (6.12+)";
  const Observed longer_one = request_on_a_fresh_thread(std::chrono::microseconds(700));
  EXPECT_TRUE(longer_one.granted);
  EXPECT_EQ(longer_one.after, 700'000);
}

}  // namespace
}  // namespace kiln
