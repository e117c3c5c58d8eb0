#include "kiln/dist/gradient_buckets.h"

#include <algorithm>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

GradientBuckets::GradientBuckets(Communicator& communicator, Tensor grads, std::span<const int64_t> parameter_starts,
                                 int64_t bucket_elements)
    : communicator_(communicator), grads_(grads) {
  KILN_CHECK(bucket_elements > 0, "config key 'ddp_bucket_size' must be positive, got {}", bucket_elements);
  KILN_CHECK(!parameter_starts.empty() && parameter_starts.front() == 0 &&
                 std::is_sorted(parameter_starts.begin(), parameter_starts.end()),
             "gradient buckets: parameter offsets must ascend from 0");
  const int64_t total = grads.numel();
  int64_t end = total;
  // Walk the parameters from the last: a bucket closes at the first parameter start that makes
  // it large enough.
  for (auto start = parameter_starts.rbegin(); start != parameter_starts.rend(); ++start) {
    if (end - *start >= bucket_elements || *start == 0) {
      if (end > *start) buckets_.push_back({*start, end});
      end = *start;
    }
  }
}

void GradientBuckets::start_next() {
  const Range range = buckets_[next_++];
  in_flight_.push_back(communicator_.all_reduce(grads_.slice(range.begin, range.end - range.begin), ReduceOp::Sum));
}

void GradientBuckets::gradients_final_from(int64_t first_final) {
  while (next_ < buckets_.size() && buckets_[next_].begin >= first_final) {
    start_next();
    ++started_early_;
  }
}

double GradientBuckets::finish() {
  const auto start = std::chrono::steady_clock::now();
  while (next_ < buckets_.size()) start_next();
  for (const auto& work : in_flight_) work->wait();
  in_flight_.clear();
  next_ = 0;
  last_started_early_ = std::exchange(started_early_, 0);
  const double waited = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return waited;
}

int64_t default_bucket_elements(int world_size) {
  return std::max<int64_t>(40'000'000, 1'000'000 * static_cast<int64_t>(world_size));
}

}  // namespace kiln
