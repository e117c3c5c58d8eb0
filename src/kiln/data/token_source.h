// TokenSource: where the Trainer's samples come from. Sample i is seq_length input tokens and
// their next-token targets, a pure function of i (and the source's seed), so any order of reads
// and any number of readers give the same batches, and a run resumes from a sample count alone.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kiln/core/uncounted_target.h"

namespace kiln {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t seq_length() const = 0;
  virtual int64_t num_tokens() const = 0;  // tokens behind the samples (0 for synthetic data)
  virtual void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const = 0;
  // n where samples 0 .. n-1 are each of the source's n samples exactly once (a classification
  // file's rows); none where samples are drawn without end (random windows, mock tokens).
  virtual std::optional<int64_t> distinct_samples() const { return std::nullopt; }
  // Makes a sample's `targets` (one row of seq_length) count for nothing, so a batch can be padded
  // with it: every target kUncountedTarget by default; a source that packs more than targets into
  // the row overrides it.
  virtual void mark_uncounted(std::span<int32_t> targets) const;
  // Samples indices[r] into row r of tokens and targets (each indices.size() x seq_length). Sources
  // on remote storage override it to fetch a whole batch's bytes at once (concurrent requests);
  // this default reads sample by sample.
  virtual void samples(std::span<const int64_t> indices, std::span<int32_t> tokens, std::span<int32_t> targets) const;

 protected:
  // samples()' precondition: tokens and targets hold `count` rows of seq_length().
  void check_rows(size_t count, std::span<const int32_t> tokens, std::span<const int32_t> targets) const;
};

// Uniformly random tokens in [0, vocab_size) (Megatron's --mock-data): for benchmarks, where the
// data must cost nothing and mean nothing.
class MockTokens final : public TokenSource {
 public:
  MockTokens(int64_t vocab_size, int64_t seq_length, uint64_t seed);
  int64_t seq_length() const override { return seq_length_; }
  int64_t num_tokens() const override { return 0; }
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;

 private:
  int64_t vocab_size_, seq_length_;
  uint64_t seed_;
};

}  // namespace kiln
