#include "kiln/data/token_source.h"

#include <algorithm>

#include "kiln/core/error.h"
#include "kiln/core/rng.h"

namespace kiln {

void TokenSource::samples(std::span<const int64_t> indices, std::span<int32_t> tokens,
                          std::span<int32_t> targets) const {
  check_rows(indices.size(), tokens, targets);
  const auto seq = static_cast<size_t>(seq_length());
  for (size_t row = 0; row < indices.size(); ++row)
    sample(indices[row], tokens.subspan(row * seq, seq), targets.subspan(row * seq, seq));
}

void TokenSource::mark_uncounted(std::span<int32_t> targets) const {
  std::fill(targets.begin(), targets.end(), kUncountedTarget);
}

void TokenSource::check_rows(size_t count, std::span<const int32_t> tokens, std::span<const int32_t> targets) const {
  const auto seq = static_cast<size_t>(seq_length());
  KILN_CHECK(tokens.size() == count * seq && targets.size() == tokens.size(),
             "{} samples of {} tokens need {} tokens and targets, got {} and {}", count, seq, count * seq,
             tokens.size(), targets.size());
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
