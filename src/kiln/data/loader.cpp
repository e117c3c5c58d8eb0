#include "kiln/data/loader.h"

#include <fmt/format.h>

#include <chrono>

#include "kiln/core/error.h"
#include "kiln/core/trace.h"

namespace kiln {

DataLoader::DataLoader(const TokenSource& source, int64_t batch_size, const LoaderOptions& options)
    : source_(source), batch_size_(batch_size), options_(options) {
  KILN_CHECK(batch_size > 0, "loader: batch size must be positive, got {}", batch_size);
  KILN_CHECK(options.num_workers >= 0, "config key 'num_workers' must be >= 0, got {}", options.num_workers);
  KILN_CHECK(options.prefetch_factor > 0, "config key 'prefetch_factor' must be positive, got {}",
             options.prefetch_factor);
  KILN_CHECK(options.cache_samples >= 0, "config key 'data_cache_samples' must be >= 0, got {}", options.cache_samples);
  KILN_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
             "loader: rank {} is outside world size {}", options.rank, options.world_size);
  for (int w = 0; w < options.num_workers; ++w)
    workers_.emplace_back([this, w] {
      trace::name_this_thread(fmt::format("{} worker {}", options_.name, w));
      worker_loop();
    });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void DataLoader::read_batch(int64_t first, Batch& batch) {
  const size_t seq = static_cast<size_t>(source_.seq_length());
  const auto rows = static_cast<size_t>(batch_size_);
  batch.tokens.resize(rows * seq);
  batch.targets.resize(batch.tokens.size());
  const auto row_of = [&](std::vector<int32_t>& values, size_t row) { return std::span(values).subspan(row * seq, seq); };
  std::vector<int64_t> indices(rows);
  for (size_t row = 0; row < rows; ++row) {  // Megatron's slices of each ranks x batch block
    const int64_t local = first + static_cast<int64_t>(row);
    indices[row] = (local / batch_size_ * options_.world_size + options_.rank) * batch_size_ + local % batch_size_;
  }
  if (options_.cache_samples == 0) {
    source_.samples(indices, batch.tokens, batch.targets);
    return;
  }
  std::vector<size_t> missing;  // rows not in the cache, read together below
  {
    std::lock_guard lock(cache_mutex_);
    for (size_t row = 0; row < rows; ++row) {
      const auto hit = cache_.find(indices[row]);
      if (hit == cache_.end()) {
        missing.push_back(row);
        continue;
      }
      lru_.splice(lru_.begin(), lru_, hit->second);
      std::copy(hit->second->tokens.begin(), hit->second->tokens.end(), row_of(batch.tokens, row).begin());
      std::copy(hit->second->targets.begin(), hit->second->targets.end(), row_of(batch.targets, row).begin());
    }
  }
  if (missing.empty()) return;
  std::vector<int64_t> missing_indices;
  for (size_t row : missing) missing_indices.push_back(indices[row]);
  std::vector<int32_t> tokens(missing.size() * seq), targets(tokens.size());
  source_.samples(missing_indices, tokens, targets);
  std::lock_guard lock(cache_mutex_);
  for (size_t m = 0; m < missing.size(); ++m) {
    const std::span<int32_t> sample_tokens = row_of(tokens, m), sample_targets = row_of(targets, m);
    std::copy(sample_tokens.begin(), sample_tokens.end(), row_of(batch.tokens, missing[m]).begin());
    std::copy(sample_targets.begin(), sample_targets.end(), row_of(batch.targets, missing[m]).begin());
    if (cache_.count(missing_indices[m])) continue;  // another worker cached it meanwhile
    lru_.push_front({missing_indices[m], {sample_tokens.begin(), sample_tokens.end()},
                     {sample_targets.begin(), sample_targets.end()}});
    cache_[missing_indices[m]] = lru_.begin();
    if (static_cast<int64_t>(lru_.size()) > options_.cache_samples) {
      cache_.erase(lru_.back().index);
      lru_.pop_back();
    }
  }
}

void DataLoader::worker_loop() {
  const int64_t capacity = static_cast<int64_t>(options_.prefetch_factor) * options_.num_workers;
  std::unique_lock lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [&] {
      return stopping_ || (next_to_schedule_ - expected_) / batch_size_ < capacity;
    });
    if (stopping_) return;
    const int64_t first = next_to_schedule_;
    const uint64_t generation = generation_;
    next_to_schedule_ += batch_size_;
    lock.unlock();
    Batch batch;
    std::exception_ptr failure;
    try {
      const trace::Span span("data", trace::recording() ? fmt::format("read samples {}..{}", first, first + batch_size_ - 1)
                                                         : std::string());
      read_batch(first, batch);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // the consumer restarted; this batch is stale
    if (failure) {
      failures_.emplace(first, failure);
    } else {
      ready_.emplace(first, std::move(batch));
    }
    batch_ready_.notify_all();
  }
}

void DataLoader::next(int64_t first, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  const auto start = std::chrono::steady_clock::now();
  if (workers_.empty()) {  // reading in the consumer's thread: all of it is waiting for data
    Batch batch;
    read_batch(first, batch);
    tokens = std::move(batch.tokens);
    targets = std::move(batch.targets);
    std::lock_guard lock(mutex_);
    wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  std::unique_lock lock(mutex_);
  if (first != expected_) {  // not the continuation: restart the pipeline here
    ++generation_;
    ready_.clear();
    failures_.clear();
    expected_ = first;
    next_to_schedule_ = first;
    work_ready_.notify_all();
  }
  batch_ready_.wait(lock, [&] { return ready_.count(first) != 0 || failures_.count(first) != 0; });
  if (ready_.count(first) == 0) {
    const std::exception_ptr failure = failures_.at(first);
    ++generation_;  // the next request restarts cleanly
    failures_.clear();
    ready_.clear();
    expected_ = next_to_schedule_ = first;
    std::rethrow_exception(failure);
  }
  Batch batch = std::move(ready_.at(first));
  ready_.erase(first);
  expected_ = first + batch_size_;
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  lock.unlock();
  work_ready_.notify_all();
  tokens = std::move(batch.tokens);
  targets = std::move(batch.targets);
}

void DataLoader::next_into(int64_t first, std::span<int32_t> tokens, std::span<int32_t> targets) {
  next(first, scratch_tokens_, scratch_targets_);
  KILN_CHECK(tokens.size() == scratch_tokens_.size() && targets.size() == scratch_targets_.size(),
             "loader: buffers of {} and {} values for a batch of {}", tokens.size(), targets.size(),
             scratch_tokens_.size());
  std::copy(scratch_tokens_.begin(), scratch_tokens_.end(), tokens.begin());
  std::copy(scratch_targets_.begin(), scratch_targets_.end(), targets.begin());
}

double DataLoader::take_wait_ms() {
  std::lock_guard lock(mutex_);
  const double ms = wait_ms_;
  wait_ms_ = 0;
  return ms;
}

}  // namespace kiln
