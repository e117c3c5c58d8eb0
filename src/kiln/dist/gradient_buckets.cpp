#include "kiln/dist/gradient_buckets.h"

#include <algorithm>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

GradientBuckets::GradientBuckets(Communicator& communicator, Tensor grads, std::span<const int64_t> parameter_starts,
                                 int64_t bucket_elements, int64_t early_end, int64_t owner_shard)
    : communicator_(communicator), grads_(grads), has_early_(early_end > 0), owner_shard_(owner_shard) {
  KILN_CHECK(bucket_elements > 0, "config key 'ddp_bucket_size' must be positive, got {}", bucket_elements);
  KILN_CHECK(!parameter_starts.empty() && parameter_starts.front() == 0 &&
                 std::is_sorted(parameter_starts.begin(), parameter_starts.end()),
             "gradient buckets: parameter offsets must ascend from 0");
  KILN_CHECK(early_end == 0 || std::binary_search(parameter_starts.begin(), parameter_starts.end(), early_end),
             "gradient buckets: the early bucket must end at a parameter start, not at {}", early_end);
  const int64_t total = grads.numel();
  KILN_CHECK(owner_shard == 0 || owner_shard * communicator.world_size() == total,
             "gradient buckets: {} ranks' shards of {} elements do not make the buffer's {}", communicator.world_size(),
             owner_shard, total);
  int64_t end = total;
  // Walk the parameters from the last: a bucket closes at the first parameter start that makes
  // it large enough, and at the early bucket's end; the early bucket is whatever lies below that.
  for (auto start = parameter_starts.rbegin(); start != parameter_starts.rend(); ++start) {
    if (*start < early_end) continue;
    if (end - *start >= bucket_elements || *start == 0 || *start == early_end) {
      if (end > *start) buckets_.push_back({*start, end});
      end = *start;
    }
  }
  if (has_early_) buckets_.push_back({0, early_end});
  started_.assign(buckets_.size(), false);
  if (owner_shard_ == 0)
    for (const Range& range : buckets_)
      prepared_.push_back(communicator_.prepare_all_reduce(grads_.slice(range.begin, range.end - range.begin)));
}

void GradientBuckets::start(size_t bucket) {
  const Range range = buckets_[bucket];
  started_[bucket] = true;
  if (owner_shard_ == 0) {
    in_flight_.push_back(prepared_[bucket]->start());
    return;
  }
  for (int64_t begin = range.begin; begin < range.end;) {
    const int64_t owner = begin / owner_shard_, end = std::min(range.end, (owner + 1) * owner_shard_);
    in_flight_.push_back(communicator_.reduce(grads_.slice(begin, end - begin), static_cast<int>(owner)));
    begin = end;
  }
}

void GradientBuckets::start_early() {
  if (!has_early_ || started_.back()) return;
  start(buckets_.size() - 1);
  ++started_early_;
}

void GradientBuckets::gradients_final_from(int64_t first_final) {
  for (; next_ < buckets_.size() && buckets_[next_].begin >= first_final; ++next_) {
    if (started_[next_]) continue;
    start(next_);
    ++started_early_;
  }
}

double GradientBuckets::finish() {
  const auto began = std::chrono::steady_clock::now();
  for (; next_ < buckets_.size(); ++next_)
    if (!started_[next_]) start(next_);
  for (const auto& work : in_flight_) work->wait();
  in_flight_.clear();
  next_ = 0;
  started_.assign(buckets_.size(), false);
  last_started_early_ = std::exchange(started_early_, 0);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
}

int64_t default_bucket_elements(int world_size) {
  return std::max<int64_t>(40'000'000, 1'000'000 * static_cast<int64_t>(world_size));
}

}  // namespace kiln
