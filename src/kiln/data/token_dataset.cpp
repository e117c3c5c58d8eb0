#include "kiln/data/token_dataset.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/core/json_numbers.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace fs = std::filesystem;

TokenDataset::TokenDataset(const std::string& dir, const std::string& split, int64_t vocab_size,
                           int64_t seq_length, uint64_t seed, const Storage& storage)
    : seq_length_(seq_length), seed_(seed) {
  KILN_CHECK(seq_length > 0, "seq_length must be positive, got {}", seq_length);
  if (!is_s3_uri(dir)) {
    std::error_code error;
    KILN_CHECK(fs::is_directory(dir, error), "data_path '{}' is not a folder", dir);
  }
  std::vector<std::string> paths;
  const std::string prefix = split + "_";
  for (const std::string& name : storage.list(dir))
    if (name.starts_with(prefix) && name.ends_with(".bin")) paths.push_back(dir + "/" + name);
  KILN_CHECK(!paths.empty(), "data_path '{}' has no {} shards ({}*.bin)", dir, split, prefix);
  window_offsets_.push_back(0);
  for (const std::string& path : paths) {
    shards_.emplace_back(path, vocab_size, storage);
    num_tokens_ += shards_.back().size();
    const int64_t windows = std::max<int64_t>(0, shards_.back().size() - seq_length);
    window_offsets_.push_back(window_offsets_.back() + windows);
  }
  window_offsets_.erase(window_offsets_.begin());
  KILN_CHECK(num_windows() > 0,
             "data_path '{}': no {} shard holds {} tokens (seq_length + 1); the split has {} tokens",
             dir, split, seq_length + 1, num_tokens_);
}

void TokenDataset::sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  KILN_CHECK(tokens.size() == static_cast<size_t>(seq_length_) && targets.size() == tokens.size(),
             "sample buffers hold {} and {} tokens, expected {}", tokens.size(), targets.size(),
             seq_length_);
  const uint64_t draw = mix64(mix64(seed_) ^ static_cast<uint64_t>(index));
  const int64_t window = static_cast<int64_t>(draw % static_cast<uint64_t>(num_windows()));
  const auto shard_it = std::upper_bound(window_offsets_.begin(), window_offsets_.end(), window);
  const size_t shard_index = static_cast<size_t>(shard_it - window_offsets_.begin());
  const int64_t start = window - (shard_index ? window_offsets_[shard_index - 1] : 0);
  thread_local std::vector<int32_t> sample_tokens;
  sample_tokens.resize(static_cast<size_t>(seq_length_ + 1));
  shards_[shard_index].read(start, sample_tokens);
  std::copy(sample_tokens.begin(), sample_tokens.end() - 1, tokens.begin());
  std::copy(sample_tokens.begin() + 1, sample_tokens.end(), targets.begin());
}

std::optional<int64_t> read_data_vocab_size(const std::string& dir, const Storage& storage) {
  const std::string path = dir + "/meta.json";
  if (!storage.exists(path)) return std::nullopt;
  try {
    const nlohmann::json meta = nlohmann::json::parse(storage.read_all(path));
    return json_int64_at(meta, "vocab_size", 1, std::numeric_limits<int32_t>::max(), path);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: cannot read vocab_size: {}", path, error.what());
  }
}

}  // namespace kiln
