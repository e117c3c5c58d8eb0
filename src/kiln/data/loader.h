// DataLoader: batches from a TokenSource, prepared ahead by worker threads (DALI-style stage with
// a bounded queue). The trainer asks for batches by their first sample index; while it computes,
// `num_workers` threads assemble the following batches (first + k * batch_size) into a queue of at
// most prefetch_factor x num_workers batches. A request that does not continue the sequence (a
// validation pass, a resume) drops the queue and restarts from there. Batches depend only on
// their indices, so the result is identical for any worker count (tested). Errors raised while a
// worker reads are re-raised in next(). With cache_samples > 0, decoded samples are kept in a
// bounded LRU cache shared by the workers. num_workers = 0 reads synchronously in next().
// Sharding (rank, world_size) follows Megatron's data-parallel slicing: the global order is cut
// into blocks of world_size batches and rank r reads batch r of each block, so local sample i is
// global sample (i / batch x world_size + r) x batch + i % batch. The ranks' batches are disjoint,
// together cover the global stream, and a global batch of micro x ranks x accumulation samples
// holds the same samples for any number of ranks.
// One consumer thread; destruction stops and joins the workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/data/token_source.h"

namespace kiln {

struct LoaderOptions {
  int num_workers = 2;
  int prefetch_factor = 2;
  int64_t cache_samples = 0;
  int64_t rank = 0, world_size = 1;
  std::string name = "loader";  // its workers' thread names in a step trace: "<name> worker <k>"
};

class DataLoader {
 public:
  DataLoader(const TokenSource& source, int64_t batch_size, const LoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Fills tokens/targets (batch_size x seq_length each) with samples first .. first + batch - 1.
  void next(int64_t first, std::vector<int32_t>& tokens, std::vector<int32_t>& targets);
  // The same, copied into caller-owned memory (a pinned staging slot) of batch x seq_length each.
  void next_into(int64_t first, std::span<int32_t> tokens, std::span<int32_t> targets);
  // Milliseconds next() spent waiting for a batch since the last call of this (the data stall).
  double take_wait_ms();

 private:
  struct Batch {
    std::vector<int32_t> tokens, targets;
  };
  void worker_loop();
  // The batch of local samples [first, first + batch size): cache hits copied, the misses read
  // with one TokenSource::samples call.
  void read_batch(int64_t first, Batch& batch);

  const TokenSource& source_;
  const int64_t batch_size_;
  const LoaderOptions options_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_, batch_ready_;
  bool stopping_ = false;
  uint64_t generation_ = 0;         // bumped on a restart; stale results are dropped
  int64_t expected_ = 0;            // first index of the batch the consumer will ask for next
  int64_t next_to_schedule_ = 0;    // first index of the next batch a worker will start
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> failures_;  // by first index, re-raised when that batch is asked for
  double wait_ms_ = 0;
  // LRU cache of decoded samples: index -> position in lru_.
  struct CachedSample {
    int64_t index;
    std::vector<int32_t> tokens, targets;
  };
  std::mutex cache_mutex_;
  std::list<CachedSample> lru_;
  std::unordered_map<int64_t, std::list<CachedSample>::iterator> cache_;
  std::vector<int32_t> scratch_tokens_, scratch_targets_;  // next_into()'s batch
};

}  // namespace kiln
