// Which random bits each dropout of a training forward draws (ops.h, Dropout; core/philox.h).
//
// A forward's masks are named by a DropoutDraw: the run's seed, the iteration and the
// micro-batch's index in the iteration's global batch (Megatron's order: micro-batch k of rank r is
// k x ranks + r). Each dropout site of the model then draws its own Philox stream under one key:
//   key    = mix64(seed ^ mix64(iteration + 1))            (core/rng.h)
//   stream = micro_batch << 20 | layer << 2 | site        (layer < 2^18: kMaxLayers is 2^16)
// So the mask of an element depends on nothing but (seed, iteration, micro-batch, layer, site,
// element): a recomputed block and the backward draw the forward's mask again, a resumed run draws
// the masks the uninterrupted one did, every micro-batch and so every rank draws its own, and a
// run on 2 ranks draws the very masks of 1 rank with twice the accumulation. Evaluation and
// generation draw nothing (dropout is a training forward's only).
#pragma once

#include <cstdint>

#include "kiln/core/rng.h"

namespace kiln {

struct DropoutDraw {
  uint64_t seed = 0;
  int64_t iteration = 0;    // 0-based, of the run
  int64_t micro_batch = 0;  // in the global batch
  bool operator==(const DropoutDraw&) const = default;
};

// The sites of a GPT (and encoder) block, and the embedding's output (drawn with layer 0). The
// attention's probabilities draw element ((b NH + h) T + query) T + key of their stream (ops.h).
enum class DropoutSite : uint64_t { AttentionOutput = 0, MlpOutput = 1, Embedding = 2, AttentionProbabilities = 3 };

inline uint64_t dropout_key(const DropoutDraw& draw) {
  return mix64(draw.seed ^ mix64(static_cast<uint64_t>(draw.iteration) + 1));
}
inline uint64_t dropout_stream(const DropoutDraw& draw, int64_t layer, DropoutSite site) {
  return static_cast<uint64_t>(draw.micro_batch) << 20 | static_cast<uint64_t>(layer) << 2 |
         static_cast<uint64_t>(site);
}

}  // namespace kiln
