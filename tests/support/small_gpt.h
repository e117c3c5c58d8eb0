// The small GPT the end-to-end precision and device tests train: 2 layers, 48 wide, 2 heads of
// 24 (a head size off the fast paths), sequence 32, micro-batch 4 with accumulation 2, 20 steps.
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

}  // namespace kiln::testing
