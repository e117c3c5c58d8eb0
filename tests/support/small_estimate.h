// Test helper: the estimator's input for a small GPT (2 layers, 64 wide, 4 heads, sequence 32,
// vocabulary 128; global batch 4 in one micro-batch; 100 TFLOP/s per GPU), whose formulas the
// estimator tests work out by hand.
#pragma once

#include "kiln/perf/estimator.h"

namespace kiln::testing {

inline EstimateInput small_estimate_input() {
  EstimateInput in;
  in.num_layers = 2;
  in.hidden_size = 64;
  in.num_attention_heads = 4;
  in.seq_length = 32;
  in.vocab_size = 128;
  in.global_batch_size = 4;
  in.micro_batch_size = 4;
  in.tflops_per_gpu = 100;
  return in;
}

}  // namespace kiln::testing
