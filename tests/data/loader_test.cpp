// The data loader: same batches for any worker count, bounded read-ahead, restarts, errors, cache.
#include "kiln/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/data/token_source.h"
#include "support/error_of.h"

namespace kiln {
namespace {

using testing::error_of;

// Sample i is [i, i+1, ...]; counts reads; can fail at one index and be slow.
class CountingSource final : public TokenSource {
 public:
  explicit CountingSource(int64_t fail_at = -1, int delay_us = 0) : fail_at_(fail_at), delay_us_(delay_us) {}
  int64_t seq_length() const override { return 4; }
  int64_t num_tokens() const override { return 0; }
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override {
    ++reads;
    highest = std::max<int64_t>(highest, index);
    if (delay_us_) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    KILN_CHECK(index != fail_at_, "shard.bin: unreadable sample {}", index);
    for (size_t t = 0; t < tokens.size(); ++t) {
      tokens[t] = static_cast<int32_t>(index * 10 + static_cast<int64_t>(t));
      targets[t] = tokens[t] + 1;
    }
  }
  mutable std::atomic<int64_t> reads{0}, highest{-1};

 private:
  int64_t fail_at_;
  int delay_us_;
};

std::vector<std::vector<int32_t>> read_schedule(int workers, const std::vector<int64_t>& firsts) {
  CountingSource source;
  DataLoader loader(source, 3, {workers, 2, 0});
  std::vector<std::vector<int32_t>> batches;
  for (int64_t first : firsts) {
    std::vector<int32_t> tokens, targets;
    loader.next(first, tokens, targets);
    batches.push_back(tokens);
  }
  return batches;
}

TEST(DataLoader, SameBatchesForAnyWorkerCountIncludingRestarts) {
  const std::vector<int64_t> firsts = {0, 3, 6, 9, 0, 3, 100, 103, 106, 12};  // restarts at 0, 100, 12
  const auto reference = read_schedule(0, firsts);
  EXPECT_EQ(reference[0], (std::vector<int32_t>{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}));
  for (int workers : {1, 2, 5}) EXPECT_EQ(read_schedule(workers, firsts), reference) << workers << " workers";
}

TEST(DataLoader, ReadAheadIsBounded) {
  CountingSource source;
  DataLoader loader(source, 2, {2, 3, 0});  // at most 3 x 2 = 6 batches ahead
  std::vector<int32_t> tokens, targets;
  loader.next(0, tokens, targets);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the workers run ahead
  // Consumed batch 0 (samples 0-1); batches 1..6 may be queued: samples up to 13.
  EXPECT_LE(source.highest.load(), 13);
  EXPECT_GE(source.highest.load(), 3);  // and they did read ahead
}

TEST(DataLoader, AWorkersErrorReachesTheTrainerForThatBatch) {
  CountingSource source(/*fail_at=*/7);
  DataLoader loader(source, 2, {2, 2, 0});
  std::vector<int32_t> tokens, targets;
  loader.next(0, tokens, targets);
  loader.next(2, tokens, targets);
  loader.next(4, tokens, targets);  // fine although batch 6 (samples 6, 7) has already failed
  EXPECT_NE(error_of([&] { loader.next(6, tokens, targets); }).find("shard.bin: unreadable sample 7"),
            std::string::npos);
  loader.next(8, tokens, targets);  // and the loader goes on after the error
  EXPECT_EQ(tokens[0], 80);
}

TEST(DataLoader, CacheServesRepeatedSamplesWithoutReading) {
  CountingSource source;
  DataLoader loader(source, 4, {0, 1, 16});
  std::vector<int32_t> tokens, targets;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (int64_t first : {0, 4, 8, 12}) loader.next(first, tokens, targets);
  EXPECT_EQ(source.reads.load(), 16);
  loader.next(16, tokens, targets);  // evicts the least recent four
  loader.next(0, tokens, targets);
  EXPECT_EQ(source.reads.load(), 24);
}

TEST(DataLoader, WorkersHideSlowReads) {
  // 2 ms per sample, 4 samples per batch: 8 ms of reading per batch. With four workers reading
  // ahead while the consumer "computes" 8 ms per batch, the wait nearly vanishes.
  auto waited = [](int workers) {
    CountingSource source(-1, 2000);
    DataLoader loader(source, 4, {workers, 2, 0});
    std::vector<int32_t> tokens, targets;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < 20; ++b) {
      loader.next(4 * b, tokens, targets);
      std::this_thread::sleep_for(std::chrono::milliseconds(8));
    }
    const double stall = loader.take_wait_ms();
    return std::make_pair(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
                          stall);
  };
  const auto [synchronous, synchronous_stall] = waited(0);
  const auto [prefetched, prefetched_stall] = waited(4);
  std::printf("20 batches: %.0f ms synchronous (%.0f ms waiting), %.0f ms with 4 workers (%.0f ms waiting)\n",
              synchronous, synchronous_stall, prefetched, prefetched_stall);
  EXPECT_LT(prefetched, 0.75 * synchronous);
  EXPECT_GE(synchronous_stall, 20 * 4 * 2.0) << "reading in the consumer's thread is all data wait";
  EXPECT_LT(prefetched_stall, 0.5 * synchronous_stall);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(DataLoader, RanksReadDisjointSlicesOfTheGlobalStream) {
  // Megatron's partition: rank r gets batch r of every block of W batches.
  CountingSource source;
  constexpr int64_t kWorld = 3, kBatch = 2, kBatches = 4;
  std::vector<int32_t> first_tokens_seen;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    LoaderOptions options{2, 2, 0, rank, kWorld};
    DataLoader loader(source, kBatch, options);
    for (int64_t b = 0; b < kBatches; ++b) {
      std::vector<int32_t> tokens(kBatch * 4), targets(kBatch * 4);
      loader.next_into(b * kBatch, tokens, targets);
      for (int64_t row = 0; row < kBatch; ++row) {
        const int32_t sample = tokens[static_cast<size_t>(row * 4)] / 10;
        EXPECT_EQ(sample, (b * kWorld + rank) * kBatch + row);
        first_tokens_seen.push_back(sample);
      }
    }
  }
  std::sort(first_tokens_seen.begin(), first_tokens_seen.end());
  for (size_t i = 0; i < first_tokens_seen.size(); ++i) EXPECT_EQ(first_tokens_seen[i], static_cast<int32_t>(i));
  EXPECT_NE(error_of([&] { DataLoader(source, 2, LoaderOptions{0, 1, 0, 3, 3}); }).find("rank 3 is outside world size 3"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
