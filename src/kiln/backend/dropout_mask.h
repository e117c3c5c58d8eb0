// The keep-or-drop rule every dropout of kiln applies, on both back-ends (ops.h: Dropout,
// AttentionDropout): element `index` of the Philox stream (seed, stream) is kept iff its 32 bits
// are at least round(p 2^32), and a kept value is scaled by 1 / (1 - p). Header-only, host and
// device.
#pragma once

#include <cstdint>

#include "kiln/core/host_device.h"
#include "kiln/core/philox.h"

namespace kiln {

// The least bits an element keeps at probability p: round(p 2^32), in [0, 2^32).
KILN_HOST_DEVICE inline uint64_t dropout_threshold(float probability) {
  return static_cast<uint64_t>(static_cast<double>(probability) * 4294967296.0 + 0.5);
}

struct DropoutMask {
  uint64_t seed = 0, stream = 0;
  uint64_t threshold = 0;  // dropout_threshold(p)
  float scale = 1.0f;      // 1 / (1 - p)

  // What element `index` is multiplied by: the scale, or 0.
  KILN_HOST_DEVICE float factor(uint64_t index) const {
    return philox::bits(seed, stream, index) >= threshold ? scale : 0.0f;
  }
};

// The mask of dropout at `probability` in [0, 1) on stream (seed, stream).
inline DropoutMask dropout_mask(float probability, uint64_t seed, uint64_t stream) {
  return {seed, stream, dropout_threshold(probability), 1.0f / (1.0f - probability)};
}

}  // namespace kiln
