// The shape of a GPT-2 style model. padded_vocab_size rounds vocab_size up to a multiple of 64
// so the classifier GEMM has friendly sizes; the padding rows are zero and never predicted.
#pragma once

#include <cstdint>

namespace kiln {

struct GptConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_heads = 2;
  int64_t vocab_size = 257;
  int64_t max_position_embeddings = 128;
  float init_method_std = 0.02f;
  float layernorm_eps = 1e-5f;

  static constexpr int64_t kVocabPadding = 64;
  int64_t padded_vocab_size() const {
    return (vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  }
  int64_t head_size() const { return hidden_size / num_heads; }
  void validate() const;  // throws kiln::Error naming the offending field
};

}  // namespace kiln
