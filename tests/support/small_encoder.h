// The small encoder classifier the end-to-end precision tests train: 2 blocks 32 wide, 2 heads,
// sequence 16, micro-batch 8 with accumulation 2, 30 steps, over labelled text written by
// support/pool_texts.h into `dir`/train.jsonl, hidden and attention dropout at `dropout`, fp32
// (the callers set the precision).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/train/config.h"

namespace kiln::testing {

inline Config small_encoder_config(const std::string& dir, const std::string& device, int64_t intermediate_layers,
                                   double dropout) {
  Config config;
  config.model = "encoder-classifier";
  config.device = device;
  config.data_path = dir + "/train.jsonl";
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 2;
  config.num_intermediate_layers = intermediate_layers;
  config.seq_length = 16;
  config.micro_batch_size = 8;
  config.global_batch_size = 16;
  config.train_iters = 30;
  config.lr = 3e-3;
  config.lr_warmup_iters = 3;
  config.eval_iters = 0;
  config.num_workers = 0;
  config.hidden_dropout = dropout;
  config.attention_dropout = dropout;
  return config;
}

}  // namespace kiln::testing
