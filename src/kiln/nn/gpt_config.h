// The shape of a GPT-2 style model. padded_vocab_size rounds vocab_size up to a multiple of 64
// so the classifier GEMM has friendly sizes; the padding rows are zero and never predicted.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

struct GptConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_heads = 2;
  int64_t vocab_size = 257;
  int64_t max_position_embeddings = 128;
  float init_method_std = 0.02f;
  float layernorm_eps = 1e-5f;
  // Megatron's hidden_dropout: the embedding's output and each block's two projections are dropped
  // at this rate in training forwards (block.h, BranchDropout); 0 keeps everything.
  float hidden_dropout = 0.0f;
  // Megatron's attention_dropout: each block's attention probabilities are dropped at this rate in
  // training forwards, inside the attention op (ops.h, AttentionDropout); 0 keeps everything.
  float attention_dropout = 0.0f;

  static constexpr int64_t kVocabPadding = 64;
  int64_t padded_vocab_size() const {
    return (vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  }
  int64_t head_size() const { return hidden_size / num_heads; }
  void validate() const;  // throws kiln::Error naming the offending field
};

// The sizes of a training run that kiln refuses: past any machine's memory, they would also
// overflow the 64-bit element and byte counts derived from them, or the per-layer bookkeeping.
inline constexpr double kMaxTensorElements = 9007199254740992.0;  // 2^53 elements in one tensor
inline constexpr int64_t kMaxLayers = 65536;

// What of a training run is beyond those limits, described: the layer count, or the first of its
// largest tensors (the parameters, the MLP activation and the logits of one micro-batch, its
// attention scores) with more elements than kMaxTensorElements; "" when nothing is. Counted in
// floating point, so any positive sizes get an answer.
std::string beyond_size_limits(int64_t num_layers, int64_t hidden_size, int64_t num_heads, int64_t vocab_size,
                               int64_t seq_length, int64_t micro_batch_size);

}  // namespace kiln
