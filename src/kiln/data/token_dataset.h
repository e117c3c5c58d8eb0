// TokenDataset: training or validation samples drawn from the token shards of one split.
//
// Sample i is a window of seq_length + 1 consecutive tokens (inputs and next-token targets) at a
// position chosen by hashing (seed, i): random, reproducible, independent of how many threads
// read, and resumable from nothing but the number of samples consumed. Windows never cross a
// shard boundary. Shards are read through a Storage (local or S3) and validated on open
// (token_shard.h).
// Thread-safe for concurrent sample() calls.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/data/token_shard.h"
#include "kiln/data/token_source.h"

namespace kiln {

class TokenDataset final : public TokenSource {
 public:
  // Opens "<dir>/<split>_*.bin" in name order. Errors name the folder when there is no shard or
  // when no shard holds a whole window.
  TokenDataset(const std::string& dir, const std::string& split, int64_t vocab_size,
               int64_t seq_length, uint64_t seed, const Storage& storage = Storage::defaults());

  int64_t num_tokens() const override { return num_tokens_; }
  int64_t num_windows() const { return window_offsets_.empty() ? 0 : window_offsets_.back(); }
  int64_t seq_length() const override { return seq_length_; }
  size_t num_shards() const { return shards_.size(); }

  // Writes sample `index` into tokens[0, seq) and targets[0, seq).
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> window_offsets_;  // prefix sums of windows per shard
  int64_t seq_length_ = 0;
  int64_t num_tokens_ = 0;
  uint64_t seed_ = 0;
};

// The vocabulary size recorded in "<dir>/meta.json" by prepare-text, if the file exists.
std::optional<int64_t> read_data_vocab_size(const std::string& dir, const Storage& storage = Storage::defaults());

}  // namespace kiln
