// Labelled text a classifier learns in a few dozen steps: `rows` e-mail-like JSON lines,
// "Subject:" then 5 to 12 words all from one of two word pools; the label is the pool. The first
// token is the same in every text, so the pooled first position must attend to the rest to tell
// them apart.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "kiln/core/rng.h"

namespace kiln::testing {

inline void write_pool_texts(const std::string& path, int64_t rows, uint64_t seed) {
  static const char* const kPools[2][6] = {{"meeting", "agenda", "notes", "project", "review", "lunch"},
                                           {"prize", "winner", "cash", "offer", "free", "claim"}};
  Rng rng(seed);
  std::ofstream out(path);
  for (int64_t row = 0; row < rows; ++row) {
    const auto label = static_cast<int>(rng.below(2));
    std::string text = "Subject:";
    const uint64_t words = 5 + rng.below(8);
    for (uint64_t w = 0; w < words; ++w) text += std::string(" ") + kPools[label][rng.below(6)];
    out << "{\"text\": \"" << text << "\", \"label\": " << label << "}\n";
  }
}

}  // namespace kiln::testing
