// The small GPT the end-to-end precision and device tests train: 2 layers, 48 wide, 2 heads of
// 24 (a head size off the fast paths), sequence 32, micro-batch 4 with accumulation 2, 20 steps.
// And a tinier one on random tokens, for tests of what wraps a step (communicators, observers).
#pragma once

#include <string>

#include "kiln/train/config.h"

namespace kiln::testing {

inline Config small_gpt_config(const std::string& data, const std::string& device) {
  Config config;
  config.device = device;
  config.data_path = data;
  config.num_layers = 2;
  config.hidden_size = 48;
  config.num_attention_heads = 2;
  config.seq_length = 32;
  config.micro_batch_size = 4;
  config.global_batch_size = 8;
  config.train_iters = 20;
  config.lr = 3e-3;
  config.lr_warmup_iters = 3;
  config.eval_iters = 0;
  return config;
}

// 2 layers, 32 wide, sequence 16, an odd vocabulary of 67 (padded shards under ZeRO), random
// tokens, micro-batch 2, no validation, the loader on the training thread; the callers set the
// batch and the iterations.
inline Config tiny_mock_gpt_config(const std::string& device) {
  Config config;
  config.device = device;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 2;
  config.seq_length = 16;
  config.vocab_size = 67;
  config.mock_data = true;
  config.micro_batch_size = 2;
  config.eval_iters = 0;
  config.num_workers = 0;
  return config;
}

}  // namespace kiln::testing
