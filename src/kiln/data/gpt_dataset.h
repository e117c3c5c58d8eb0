// Training samples from Megatron indexed datasets, with Megatron-LM's GPTDataset semantics:
//
//   split      `--split 949,50,1`: the documents of each dataset are divided into contiguous
//              train / validation / test ranges by those weights (Megatron's rounding);
//   order      each epoch visits the split's documents in a seeded random order; epochs are
//              concatenated, so as many as the requested number of samples needs are built;
//   samples    the concatenated tokens are cut into samples of seq_length + 1 tokens, sample s
//              starting at token s * seq_length (consecutive samples share one token: the last
//              target of one is the first input of the next);
//   shuffle    sample s is read through a seeded permutation of all samples;
//   whole      num_samples kWholeSplit builds one epoch's samples, each once (distinct_samples),
//              so a validation can read the split whole: every token but the last partial window's;
//   blending   `--data-path 0.3 A 0.7 B`: each global sample goes to the dataset that is furthest
//              behind its weight (Megatron's build_blending_indices), in order;
//   cache      the document order and the shuffle are written to <prefix>_kiln_cache/ under a name
//              that hashes everything they depend on (the index file's size and time, split range,
//              sequence length, sample count, seed), so changed data or settings rebuild them;
//              each file ends with a checksum of its contents, and a damaged one is rebuilt.
//              For data on S3 the cache lives under the storage's cache_dir (none without one).
// Requests past the planned number of samples wrap around. Thread-safe for concurrent sample().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/data/indexed_dataset.h"
#include "kiln/data/token_source.h"

namespace kiln {

enum class DataSplit { Train = 0, Validation = 1, Test = 2 };

// Parses "949,50,1" into three non-negative weights summing to more than zero.
std::vector<double> parse_split(const std::string& split);
// Megatron's document ranges [begin, end) for the three splits of `documents` documents.
std::vector<std::pair<int64_t, int64_t>> split_ranges(const std::vector<double>& weights, int64_t documents);

// A `data_path` value: one prefix, or weight/prefix pairs ("0.3 A 0.7 B").
struct DataBlend {
  std::vector<double> weights;   // normalised
  std::vector<std::string> prefixes;
};
DataBlend parse_data_path(const std::string& data_path);
// True when data_path names indexed datasets (PREFIX.idx exists, or a blend), not a shard folder.
bool is_indexed_data_path(const std::string& data_path, const Storage& storage = Storage::defaults());

class GptDataset final : public TokenSource {
 public:
  // num_samples for exactly the split's samples, one epoch of them (above).
  static constexpr int64_t kWholeSplit = -1;

  GptDataset(std::shared_ptr<const IndexedDataset> data, const std::string& prefix,
             std::pair<int64_t, int64_t> documents, int64_t seq_length, int64_t num_samples, uint64_t seed,
             const Storage& storage = Storage::defaults());

  int64_t seq_length() const override { return seq_length_; }
  int64_t num_tokens() const override { return tokens_per_epoch_; }
  int64_t num_samples() const { return static_cast<int64_t>(shuffle_.size()); }
  // Built with kWholeSplit: the epoch's samples; else drawn without end (TokenSource's default).
  std::optional<int64_t> distinct_samples() const override;
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;
  // The whole batch's token ranges in one IndexedDataset::read_many.
  void samples(std::span<const int64_t> indices, std::span<int32_t> tokens,
               std::span<int32_t> targets) const override;

 private:
  // The ranges of the seq_length + 1 tokens of sample `index`, appended to `ranges`.
  void plan_window(int64_t index, std::vector<IndexedDataset::TokenRange>& ranges) const;

  std::shared_ptr<const IndexedDataset> data_;
  int64_t seq_length_;
  int64_t tokens_per_epoch_ = 0;
  bool whole_split_ = false;
  std::vector<int32_t> document_order_;  // all epochs, concatenated
  std::vector<int64_t> document_starts_; // token offset of each entry of document_order_
  std::vector<int64_t> shuffle_;
};

// Several GptDatasets as one source (blending, above). Its samples are next-token windows drawn
// by weight without a fixed end (never a whole split): TokenSource's distinct_samples and
// mark_uncounted as they are.
class BlendedTokens final : public TokenSource {
 public:
  BlendedTokens(std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
                int64_t num_samples);
  int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  int64_t num_tokens() const override;
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;
  // Each member dataset reads its share of the batch at once.
  void samples(std::span<const int64_t> indices, std::span<int32_t> tokens,
               std::span<int32_t> targets) const override;

 private:
  std::vector<std::unique_ptr<GptDataset>> datasets_;
  std::vector<int16_t> dataset_of_;      // global sample -> dataset
  std::vector<int64_t> sample_in_dataset_;
};

// The whole pipeline for one split: parse data_path, open and validate each dataset, build (or
// load) the indices, blend when there are several. num_samples: how many the run will read, or
// GptDataset::kWholeSplit (one dataset only: a blend's samples are drawn by weight, without end).
std::unique_ptr<TokenSource> make_gpt_data(const std::string& data_path, const std::string& split, DataSplit which,
                                           int64_t vocab_size, int64_t seq_length, int64_t num_samples, uint64_t seed,
                                           const Storage& storage = Storage::defaults());

}  // namespace kiln
