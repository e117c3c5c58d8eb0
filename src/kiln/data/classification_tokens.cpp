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

namespace {

class TextClassificationTokens final : public TokenSource {
 public:
  TextClassificationTokens(const std::string& path, const Gpt2Tokenizer& tokenizer,
                           const TextClassificationOptions& options, uint64_t seed, const Storage& storage)
      : text_(path, tokenizer, options, storage),
        tokens_([this](int64_t row) { return text_.sample(row); }, text_.size(), options.seq_length, seed, path) {}
  int64_t seq_length() const override { return tokens_.seq_length(); }
  int64_t num_tokens() const override { return tokens_.num_tokens(); }
  void sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override {
    tokens_.sample(index, tokens, targets);
  }

 private:
  TextClassificationDataset text_;
  ClassificationTokens tokens_;
};

}  // namespace

std::unique_ptr<TokenSource> open_text_classification_tokens(const std::string& path, const Gpt2Tokenizer& tokenizer,
                                                             const TextClassificationOptions& options, uint64_t seed,
                                                             const Storage& storage) {
  return std::make_unique<TextClassificationTokens>(path, tokenizer, options, seed, storage);
}

UnpackedClassification unpack_classification(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                             int64_t batch, int64_t seq) {
  const auto positions = static_cast<size_t>(batch * seq);
  KILN_CHECK(tokens.size() == positions && targets.size() == positions,
             "{} tokens and {} targets given for {} x {} positions", tokens.size(), targets.size(), batch, seq);
  UnpackedClassification unpacked;
  unpacked.input_ids.assign(tokens.begin(), tokens.end());
  unpacked.attention_mask.assign(targets.begin(), targets.end());
  for (int64_t b = 0; b < batch; ++b) {
    int32_t& first = unpacked.attention_mask[static_cast<size_t>(b * seq)];
    unpacked.labels.push_back(first);
    first = 1;
  }
  return unpacked;
}

}  // namespace kiln
