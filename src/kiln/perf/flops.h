// Model FLOPs of a GPT training iteration, by the closed forms of Narayanan et al. 2021
// ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// arXiv 2104.04473, section 5.1), with B the global batch, s the sequence, l layers, h hidden, V
// the vocabulary:
//   without recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
//   with full recomputation: 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
// and the achieved rate F / (seconds per iteration x GPUs x 1e12) in TFLOP/s.
#pragma once

#include <cstdint>

namespace kiln {

struct FlopsShape {
  int64_t global_batch = 1, seq = 1, layers = 1, hidden = 1, vocab = 1;
};

double flops_per_iteration(const FlopsShape& shape, bool full_recompute);

// Model FLOPs of an encoder classifier's training iteration (nn/encoder_classifier.h), counted as
// above (2 a multiply-add; the backward twice the forward; full recomputation one forward more):
// per token a block's forward is 24 h^2 (its four products) + 4 s h (q k^T and P v, the whole
// sequence, as the form above counts it), an intermediate layer's 2 h^2; per sample the pooler and
// head add 4 h^2 + 2 h L (L labels). With J intermediate layers:
//   F = (3, or 4 with full recomputation) x B (s (l (24 h^2 + 4 s h) + 2 J h^2) + 4 h^2 + 2 h L)
// For J = 0 the blocks' part is the form above without its vocabulary term.
struct EncoderFlopsShape {
  int64_t global_batch = 1, seq = 1, layers = 1, hidden = 1, intermediate_layers = 0, labels = 2;
};
double encoder_flops_per_iteration(const EncoderFlopsShape& shape, bool full_recompute);

// Closed-form parameter counts, with the unpadded vocabulary V and P positions (`kiln estimate`
// sets them beside the exact count of the model kiln builds). GPT: Narayanan et al.'s (section
// 5.1), 12 l h^2 (1 + 13/(12 h) + (V + P)/(12 l h)). The encoder classifier: GPT's, plus what its
// layout adds (nn/encoder_classifier.h): the two token-type embeddings' 2h, J intermediate layers
// of h^2 + h, the final LayerNorm's 2h, the pooler and the head's dense layer, h^2 + h each, and
// the projection to L labels, h L + L.
double gpt_closed_form_parameters(int64_t layers, int64_t hidden, int64_t vocab, int64_t positions);
double encoder_closed_form_parameters(int64_t layers, int64_t hidden, int64_t vocab, int64_t positions,
                                      int64_t intermediate_layers, int64_t labels);

// FLOPs of one attention core call, the convention of the FlashAttention papers (Dao et al. 2022,
// Dao 2023): forward 4 B T^2 C (the two products q k^T and P v over all heads), halved when causal
// (the keys after each query are skipped); backward 2.5 times forward (five products of that size).
double attention_forward_flops(int64_t batch, int64_t seq, int64_t hidden, bool causal);
constexpr double kAttentionBackwardFlopsFactor = 2.5;
double achieved_tflops(double flops, double seconds_per_iteration, int64_t gpus);

}  // namespace kiln
