// Picking the next token from logits: temperature scaling, then top-k filtering, then a draw from
// the softmax (Holtzman et al. 2020 discuss the trade-offs). temperature == 0 picks the argmax.
// top_k <= 0 or >= the vocabulary keeps every token.
#pragma once

#include <cstdint>
#include <span>

#include "kiln/core/rng.h"

namespace kiln {

int32_t sample_token(std::span<const float> logits, float temperature, int64_t top_k, Rng& rng);

}  // namespace kiln
