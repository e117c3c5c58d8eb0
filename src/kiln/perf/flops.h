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
double achieved_tflops(double flops, double seconds_per_iteration, int64_t gpus);

}  // namespace kiln
