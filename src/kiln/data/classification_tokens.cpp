#include "kiln/data/classification_tokens.h"

#include <numeric>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/core/rng.h"

namespace kiln {

ClassificationTokens::ClassificationTokens(std::function<ClassificationSample(int64_t)> read, int64_t rows,
                                           int64_t seq_length, uint64_t seed, std::string name)
    : read_(std::move(read)), rows_(rows), seq_length_(seq_length), seed_(seed), name_(std::move(name)) {
  KILN_CHECK(rows_ > 0, "{}: no samples", name_);
  KILN_CHECK(seq_length_ > 0, "{}: the sequence length must be positive, got {}", name_, seq_length_);
  order_.resize(static_cast<size_t>(rows_));
  std::iota(order_.begin(), order_.end(), 0);
  Rng rng(seed_);
  for (int64_t i = rows_ - 1; i > 0; --i)  // Fisher-Yates
    std::swap(order_[static_cast<size_t>(i)], order_[rng.below(static_cast<uint64_t>(i + 1))]);
}

int64_t ClassificationTokens::row_of(int64_t index) const {
  KILN_CHECK(index >= 0, "{}: sample {} does not exist", name_, index);
  const auto n = static_cast<uint64_t>(rows_);
  const uint64_t epoch = static_cast<uint64_t>(index) / n, within = static_cast<uint64_t>(index) % n;
  const uint64_t draw = mix64(seed_ ^ mix64(epoch + 1));
  uint64_t a = epoch == 0 ? 1 : 1 + draw % n;  // the first epoch is the shuffle itself
  while (std::gcd(a, n) != 1) a = a % n + 1;
  const uint64_t b = epoch == 0 ? 0 : mix64(draw) % n;
  // (a within + b) mod n without overflow: both factors are below 2^32 for any realistic n.
  const uint64_t position = static_cast<uint64_t>((static_cast<unsigned __int128>(a) * within + b) % n);
  return order_[position];
}

void ClassificationTokens::sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  KILN_CHECK(tokens.size() == static_cast<size_t>(seq_length_) && targets.size() == tokens.size(),
             "{}: a sample takes {} tokens and as many targets", name_, seq_length_);
  const int64_t row = row_of(index);
  const ClassificationSample sample = read_(row);
  KILN_CHECK(sample.input_ids.size() == tokens.size() && sample.attention_mask.size() == tokens.size(),
             "{}: row {} has {} ids and {} mask values, not {}", name_, row + 1, sample.input_ids.size(),
             sample.attention_mask.size(), seq_length_);
  KILN_CHECK(sample.attention_mask.front() == 1,
             "{}: row {} starts with padding (attention mask 0): a classifier reads its first token", name_, row + 1);
  std::copy(sample.input_ids.begin(), sample.input_ids.end(), tokens.begin());
  targets[0] = sample.label;
  std::copy(sample.attention_mask.begin() + 1, sample.attention_mask.end(), targets.begin() + 1);
}

void ClassificationTokens::mark_uncounted(std::span<int32_t> targets) const {
  KILN_CHECK(targets.size() == static_cast<size_t>(seq_length_), "{}: a sample takes {} targets", name_, seq_length_);
  targets[0] = kUncountedTarget;
}

namespace {

// A dataset behind ClassificationTokens, owned together.
template <typename Dataset>
class OwningClassificationTokens final : public TokenSource {
 public:
  OwningClassificationTokens(std::unique_ptr<Dataset> dataset, int64_t seq_length, uint64_t seed, std::string name)
      : dataset_(std::move(dataset)),
        tokens_([this](int64_t row) { return dataset_->sample(row); }, dataset_->size(), seq_length, seed,
                std::move(name)) {}
  int64_t seq_length() const override { return tokens_.seq_length(); }
  int64_t num_tokens() const override { return tokens_.num_tokens(); }
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override {
    tokens_.sample(index, tokens, targets);
  }
  std::optional<int64_t> distinct_samples() const override { return tokens_.distinct_samples(); }
  void mark_uncounted(std::span<int32_t> targets) const override { tokens_.mark_uncounted(targets); }

 private:
  std::unique_ptr<Dataset> dataset_;
  ClassificationTokens tokens_;
};

// Random samples, a pure function of (seed, row).
class MockClassification {
 public:
  static constexpr int64_t kRows = 65536;
  MockClassification(int64_t vocab_size, int64_t seq_length, int64_t num_labels, uint64_t seed)
      : vocab_size_(vocab_size), seq_length_(seq_length), num_labels_(num_labels), seed_(seed) {}
  int64_t size() const { return kRows; }
  ClassificationSample sample(int64_t row) const {
    ClassificationSample sample;
    Rng rng(mix64(seed_ ^ mix64(static_cast<uint64_t>(row) + 1)));
    for (int64_t i = 0; i < seq_length_; ++i)
      sample.input_ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_))));
    sample.attention_mask.assign(static_cast<size_t>(seq_length_), 1);
    sample.label = static_cast<int32_t>(sample.input_ids[seq_length_ > 1 ? 1 : 0] % num_labels_);
    return sample;
  }

 private:
  int64_t vocab_size_, seq_length_, num_labels_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<TokenSource> open_classification_csv_tokens(const std::string& dir, int64_t seq_length,
                                                            int64_t num_labels, int64_t vocab_size, uint64_t seed,
                                                            const Storage& storage) {
  auto dataset = std::make_unique<ClassificationDataset>(dir, storage);
  KILN_CHECK(dataset->seq_length() == seq_length,
             "'{}' holds samples of {} tokens, but seq_length is {}; set --seq-length {}", dir, dataset->seq_length(),
             seq_length, dataset->seq_length());
  KILN_CHECK(dataset->num_labels() == num_labels, "'{}' has {} labels, but num_labels is {}; set --num-labels {}", dir,
             dataset->num_labels(), num_labels, dataset->num_labels());
  KILN_CHECK(dataset->vocab_size() <= vocab_size,
             "'{}' has ids up to a vocabulary of {}, beyond vocab_size {}; set --vocab-size {} (or 0: from the data)",
             dir, dataset->vocab_size(), vocab_size, dataset->vocab_size());
  return std::make_unique<OwningClassificationTokens<ClassificationDataset>>(std::move(dataset), seq_length, seed,
                                                                             dir);
}

std::unique_ptr<TokenSource> make_mock_classification_tokens(int64_t vocab_size, int64_t seq_length,
                                                             int64_t num_labels, uint64_t seed) {
  KILN_CHECK(vocab_size > 0 && num_labels > 0, "mock classification data needs a vocabulary and labels");
  return std::make_unique<OwningClassificationTokens<MockClassification>>(
      std::make_unique<MockClassification>(vocab_size, seq_length, num_labels, seed), seq_length, seed,
      "mock classification data");
}

std::unique_ptr<TokenSource> open_text_classification_tokens(const std::string& path, const Gpt2Tokenizer& tokenizer,
                                                             const TextClassificationOptions& options, uint64_t seed,
                                                             const Storage& storage) {
  return std::make_unique<OwningClassificationTokens<TextClassificationDataset>>(
      std::make_unique<TextClassificationDataset>(path, tokenizer, options, storage), options.seq_length, seed, path);
}

}  // namespace kiln
