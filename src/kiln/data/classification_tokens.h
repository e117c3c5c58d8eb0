// A classification dataset as a TokenSource (token_source.h), so that the loader's workers,
// prefetch, sample cache and data-parallel slicing and the batch stager serve a classifier as
// they serve GPT (loader.h). Each sample is packed into the two rows every TokenSource gives:
//   tokens   input_ids[0 .. T)
//   targets  label, attention_mask[1], ..., attention_mask[T - 1]
// The first position of a sample is always a real token (its mask is 1: a text is never empty,
// and a sample whose first mask value is 0 is an error naming its row), so its slot carries the
// label. The encoder classifier unpacks the rows (nn/encoder_classifier.h, unpack_classification).
//
// Sample i reads row order(i) of the dataset: epoch e = i / N of the N rows visits them all, in
// a seeded shuffle composed with an affine map j -> (a_e j + b_e) mod N (a_e coprime to N) drawn
// from (seed, e), so every epoch has its own order (of more than two rows), sample i is a pure
// function of (seed, i) and a run resumes from its sample count alone. With the loader's workers, the tokenizing (a text
// dataset's sample()) runs on the worker threads. Thread-safe for concurrent sample().
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <memory>
#include <string>

#include "kiln/data/classification_csv.h"
#include "kiln/data/text_classification.h"
#include "kiln/data/token_source.h"

namespace kiln {

class ClassificationTokens final : public TokenSource {
 public:
  // `read(row)` gives the dataset's row (TextClassificationDataset::sample, ClassificationDataset::sample),
  // each of seq_length ids and mask values; it must be thread-safe. `name` names the data in errors.
  ClassificationTokens(std::function<ClassificationSample(int64_t row)> read, int64_t rows, int64_t seq_length,
                       uint64_t seed, std::string name);

  int64_t seq_length() const override { return seq_length_; }
  int64_t num_tokens() const override { return rows_ * seq_length_; }
  int64_t rows() const { return rows_; }
  // The dataset row sample `index` reads.
  int64_t row_of(int64_t index) const;
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;
  std::optional<int64_t> distinct_samples() const override { return rows_; }  // the first epoch
  // The label's slot only: the attention mask beside it still tells the model the real tokens.
  void mark_uncounted(std::span<int32_t> targets) const override;

 private:
  std::function<ClassificationSample(int64_t)> read_;
  int64_t rows_, seq_length_;
  uint64_t seed_;
  std::string name_;
  std::vector<int64_t> order_;  // the seeded shuffle of [0, rows)
};

// Raw text (a .csv or .jsonl file, or a folder of them: text_classification.h) as the loader reads it:
// a TextClassificationDataset behind ClassificationTokens, owned together; `tokenizer` is borrowed
// and must outlive the source.
std::unique_ptr<TokenSource> open_text_classification_tokens(const std::string& path, const Gpt2Tokenizer& tokenizer,
                                                             const TextClassificationOptions& options, uint64_t seed,
                                                             const Storage& storage = Storage::defaults());

// Pre-tokenized classification CSV (classification_csv.h, `kiln data synth`) as the loader reads it.
// Its sequence length and label count must be the run's and its vocabulary within the run's
// (`vocab_size`); each mismatch is an error naming the folder and the key.
std::unique_ptr<TokenSource> open_classification_csv_tokens(const std::string& dir, int64_t seq_length,
                                                            int64_t num_labels, int64_t vocab_size, uint64_t seed,
                                                            const Storage& storage = Storage::defaults());

// Random classification samples (Megatron's --mock-data, for a classifier): uniform ids in
// [0, vocab_size), every position real, label = ids[1] mod num_labels (something to learn, as the
// synthetic CSV's), a pure function of (seed, row) over 65,536 rows.
std::unique_ptr<TokenSource> make_mock_classification_tokens(int64_t vocab_size, int64_t seq_length,
                                                             int64_t num_labels, uint64_t seed);

}  // namespace kiln
