// The shape of an encoder classifier (encoder_classifier.h): a BERT-like sequence classifier with
// pre-LayerNorm blocks. The seed lab's model: 18 layers, hidden 1280 (FFN 4 x 1280 = 5120), 20
// heads, sequence 512, vocabulary 30000, 2 intermediate layers, 2 labels.
#pragma once

#include <cstdint>

#include "kiln/nn/gpt_config.h"

namespace kiln {

struct EncoderConfig {
  // BERT's type_vocab_size: token types (segments) A and B. kiln's data has one segment, type 0.
  static constexpr int64_t kTokenTypes = 2;

  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_heads = 2;
  int64_t vocab_size = 257;
  int64_t max_position_embeddings = 128;
  int64_t num_intermediate_layers = 2;  // residual Linear + GELU layers after the blocks
  int64_t num_labels = 2;
  float init_method_std = 0.02f;
  float layernorm_eps = 1e-5f;
  float hidden_dropout = 0.1f;  // the lab's model's rate, on the embedding, the blocks' branches and the intermediate layers
  float attention_dropout = 0.1f;  // the lab's model's rate, on the blocks' attention probabilities

  int64_t padded_vocab_size() const {
    return (vocab_size + GptConfig::kVocabPadding - 1) / GptConfig::kVocabPadding * GptConfig::kVocabPadding;
  }
  // The blocks' shape as block.h reads it (width, heads, LayerNorm epsilon).
  GptConfig block_shape() const;
  void validate() const;  // throws kiln::Error naming the offending field
};

}  // namespace kiln
