// GradientBuckets: data parallelism's gradient reduction over the flat gradient buffer, in
// buckets that start while the backward is still running (ARCHITECTURE.md, dist/; PyTorch DDP's
// and Megatron's buckets).
//
// A bucket is a contiguous range of the buffer, cut at parameter boundaries, of at least
// `bucket_elements` (the last one takes what is left). Buckets are formed from the end of the
// buffer: the backward finishes the parameters in reverse layer order (ln_f, the last block, ...,
// the embeddings), which is decreasing offset in the layout, so the model reports one watermark,
// "every gradient from element w on is final", and each bucket lying above it is reduced at once
// while the backward goes on below it.
//
// Averaging convention (once, here and nowhere else): the buffer holds each rank's gradients
// already divided by the global batch's micro-batch count (the loss gradient's scale, see
// Trainer::train_step), so the sum over ranks this class takes is the mean over the global batch.
//
// Where the sums go: by default every rank receives every bucket's sum (an all-reduce: data
// parallelism). With `owner_shard` > 0 the buffer is owned in shards of that many elements, rank
// r owning [r x owner_shard, (r + 1) x owner_shard) (the distributed optimizer's shards), and each
// bucket is cut at the shard boundaries it crosses and each piece reduced to its owner alone, so
// only the owner's shard of the buffer holds sums afterwards (Megatron's distributed optimizer
// reduce-scatters its buckets the same way, with the shards cut inside every bucket instead).
//
// Use per step: gradients_final_from() any number of times with a non-increasing watermark (or
// never, without overlap), then finish(), which starts what is left and waits for all of it.
// Out of order: with `early_end` > 0, the buffer's start [0, early_end) is one bucket of its own
// (the tied embedding's: Gpt::defer_embedding_lookup), which start_early() starts whenever its
// gradients are final, before the watermark reaches it; the watermark then stops above it.
// Every rank must make the same calls in the same order (the Communicator's contract).
// Not thread-safe; the communicator's thread does the reducing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/dist/communicator.h"

namespace kiln {

class GradientBuckets {
 public:
  struct Range {
    int64_t begin = 0, end = 0;
  };
  // `parameter_starts`: the offset of every parameter in the layout, ascending, starting at 0.
  // `early_end`: 0, or a parameter start (below: the early bucket). `owner_shard`: 0 (every rank
  // gets every sum), or the shard size, with owner_shard x world size = the buffer's elements.
  GradientBuckets(Communicator& communicator, Tensor grads, std::span<const int64_t> parameter_starts,
                  int64_t bucket_elements, int64_t early_end = 0, int64_t owner_shard = 0);

  // Buckets in the order they are reduced: from the end of the buffer down.
  const std::vector<Range>& buckets() const { return buckets_; }
  // Every gradient at offsets >= first_final is final for this step: start the buckets within.
  void gradients_final_from(int64_t first_final);
  // Starts the early bucket [0, early_end) now, if it has one and it is not started yet.
  void start_early();
  // Starts the buckets not yet started, waits for every bucket of the step; returns the
  // milliseconds spent waiting here (the reduction the backward did not hide).
  double finish();
  // Buckets started before finish() in the last step (a measure of the overlap).
  int64_t started_during_backward() const { return last_started_early_; }

 private:
  void start(size_t bucket);

  Communicator& communicator_;
  Tensor grads_;
  std::vector<Range> buckets_;  // with early_end, the early bucket is the last
  bool has_early_ = false;
  int64_t owner_shard_ = 0;
  std::vector<std::unique_ptr<PreparedAllReduce>> prepared_;  // a bucket each, without owners
  std::vector<bool> started_;   // this step
  std::vector<std::unique_ptr<CommWork>> in_flight_;
  size_t next_ = 0;  // the next bucket in order this step (an early one may be started already)
  int64_t started_early_ = 0, last_started_early_ = 0;
};

// The bucket size when --ddp-bucket-size is 0: Megatron-LM's rule, max(40 M, 1 M x ranks) elements.
int64_t default_bucket_elements(int world_size);

}  // namespace kiln
