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

// FLOPs of one attention core call, the convention of the FlashAttention papers (Dao et al. 2022,
// Dao 2023): forward 4 B T^2 C (the two products q k^T and P v over all heads), halved when causal
// (the keys after each query are skipped); backward 2.5 times forward (five products of that size).
double attention_forward_flops(int64_t batch, int64_t seq, int64_t hidden, bool causal);
constexpr double kAttentionBackwardFlopsFactor = 2.5;
double achieved_tflops(double flops, double seconds_per_iteration, int64_t gpus);

}  // namespace kiln
