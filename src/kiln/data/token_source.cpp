#include "kiln/data/token_source.h"

#include "kiln/core/error.h"
#include "kiln/core/rng.h"

namespace kiln {

void TokenSource::batch(int64_t first, int64_t batch, std::vector<int32_t>& tokens,
                        std::vector<int32_t>& targets) const {
  const size_t seq = static_cast<size_t>(seq_length());
  tokens.resize(static_cast<size_t>(batch) * seq);
  targets.resize(tokens.size());
  for (int64_t row = 0; row < batch; ++row)
    sample(first + row, std::span(tokens).subspan(static_cast<size_t>(row) * seq, seq),
           std::span(targets).subspan(static_cast<size_t>(row) * seq, seq));
}

MockTokens::MockTokens(int64_t vocab_size, int64_t seq_length, uint64_t seed)
    : vocab_size_(vocab_size), seq_length_(seq_length), seed_(seed) {
  KILN_CHECK(vocab_size > 0 && seq_length > 0, "mock data needs a positive vocabulary and sequence");
}

void MockTokens::sample(int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  const uint64_t stream = mix64(seed_ ^ mix64(static_cast<uint64_t>(index)));
  for (size_t t = 0; t <= tokens.size(); ++t) {
    const auto token = static_cast<int32_t>(mix64(stream + t) % static_cast<uint64_t>(vocab_size_));
    if (t < tokens.size()) tokens[t] = token;
    if (t > 0) targets[t - 1] = token;
  }
}

}  // namespace kiln
