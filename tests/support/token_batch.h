// A batch of random token ids and next-token targets, for tests that run a model directly.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/rng.h"

namespace kiln::testing {

struct TokenBatch {
  std::vector<int32_t> tokens, targets;
};

// `count` tokens and as many targets, uniform over [0, vocab), from `seed`.
inline TokenBatch random_token_batch(int64_t count, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  TokenBatch batch;
  for (int64_t i = 0; i < count; ++i) {
    batch.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    batch.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  return batch;
}

}  // namespace kiln::testing
