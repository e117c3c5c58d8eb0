// `kiln estimate`: what a configuration will cost before it runs (../shared/PERF.md formulas).
// The model is any `--model` kiln train builds (train/model_kinds.h): the exact counts, FLOPs,
// memory and roofline come from its ModelArchitecture (nn/model.h) and the model it builds, so
// GPT and the encoder classifier are estimated alike; only the closed forms are per model.
//
//   parameters    a closed form and the exact count of the model kiln builds (padded vocabulary,
//                 final LayerNorm included). GPT: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
//                 (Narayanan et al. 2021, arXiv 2104.04473). The encoder classifier, from its
//                 layout (nn/encoder_classifier.h): the same blocks and embeddings, plus J
//                 intermediate layers, the token-type embeddings, the final LayerNorm, the pooler,
//                 the head's dense layer and its projection to L labels:
//                 P + (J + 2) h^2 + (J + 6) h + (h + 1) L, equal to the exact count when V is a
//                 multiple of the padding (64)
//   FLOPs         per iteration with and without full recomputation, the architecture's
//                 (perf/flops.h: Narayanan et al.'s form for GPT, its encoder form)
//   speed         achieved TFLOP/s per GPU from a measured time per iteration, or the time per
//                 iteration from a target TFLOP/s; its share of the GPU's datasheet peak (neither
//                 given: no speed or time, has_speed false; the memory rows need neither)
//   time          days for a token budget T on n GPUs at rate X: 8 T P / (n X) with recomputation,
//                 6 T P / (n X) without, P the closed form (Narayanan et al.'s rule of 6 FLOPs a
//                 parameter and token; for the encoder it also counts its word embeddings, which
//                 are looked up and never multiplied, so it runs high by about V h / P)
//   memory        per GPU, as kiln's buffers hold it: weights, gradients and optimizer state per
//                 parameter by ZeRO stage. kiln keeps gradients in fp32 in every precision, so
//                 mixed precision is 2 (weights) + 4 (gradients) + 12 (fp32 master, two moments)
//                 = 18 bytes, the "bf16 param, fp32 grads" row of Megatron-LM's distributed-
//                 optimizer table (docs/source/api-guide/dist_optimizer.md; ZeRO-1 6 + 12/Nd,
//                 ZeRO-2 2 + 16/Nd, ZeRO-3 18/Nd), and fp32 training 4 + 4 + 8 (Rajbhandari et al.
//                 2020 count 2-byte gradients, 16 bytes, for their fp16 layout). Plus activations as
//                 the architecture's planner lays them out (in the precision's dtype) under the
//                 recompute policy, and the CUDA back-end's op workspace for the architecture's
//                 workspace needs, the largest of: attention's (backend/attention_workspace.h:
//                 with the fused kernels one fp32 per query and head, else two micro-batch x heads
//                 x s^2 matrices, shared by all layers) and the LayerNorm backward's partial sums
//                 (backend/layernorm_workspace.h); Korthikanti et al. 2022 (arXiv 2205.05198)
//                 per-layer activation bytes of a transformer layer are given for reference.
//                 With fp8 products (--fp8-format, bf16 only) also the casts of the largest product
//                 with the bias gradient's partial sums (fp8_workspace.h), plus the fp8 scaling
//                 state (nn/fp8_scaling.h); the FLOPs are the same and the share of peak stays
//                 against the bf16 peak (attention, classifier and loss stay bf16)
//   fit           the largest micro-batch whose total fits in the GPU's memory, less 1.5 GiB
//                 for the CUDA context and library workspaces
//   roofline      the least time one GPU's share of an iteration can take at the datasheet's
//                 rates, op by op, from the ops kiln's model issues (perf/roofline.h), and the
//                 tokens/s per GPU that bounds
// Parallelism is pure data parallelism over --gpus (tensor and pipeline parallelism are not modelled).
// Inputs are validated; errors name the flag. What kiln train refuses for the model (the encoder
// classifier has no tied classifier for --fp8-classifier, Config::validate) is refused here too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/nn/recompute.h"
#include "kiln/perf/gpu_specs.h"
#include "kiln/perf/roofline.h"
#include "kiln/train/config.h"

namespace kiln {

struct EstimateInput {
  std::string model = "gpt";  // a --model of kiln train: gpt or encoder-classifier
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0, seq_length = 0, vocab_size = 0;
  int64_t num_intermediate_layers = 2;  // encoder-classifier: residual Linear+GELU layers after the blocks
  int64_t num_labels = 2;               // encoder-classifier: classes
  int64_t global_batch_size = 0, micro_batch_size = 1, gpus = 1;
  std::string gpu = "h100-sxm";
  std::string precision = "bf16";  // fp32, tf32, bf16, fp16
  std::string fp8_format;          // empty (no fp8 products), hybrid or e4m3; needs bf16
  int64_t fp8_amax_history_len = 1;
  bool fp8_classifier = false;     // the classifier's products in fp8 too; needs fp8_format
  int64_t loss_chunk_rows = kDefaultLogitRows;  // positions the classifier and loss take at a time
  std::optional<double> time_per_iteration_s;
  std::optional<double> tflops_per_gpu;
  double tokens = 300e9;
  int zero_stage = 0;
  RecomputePolicy recompute;
  bool deterministic_attention = true;  // off: the attention backward's dQ sums in the op scratch
};

struct MemoryEstimate {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0;  // bytes per GPU
  // The CUDA back-end's op scratch, the largest of attention's (backend/attention_workspace.h),
  // the LayerNorm backward's partial sums (backend/layernorm_workspace.h) and, with fp8 products,
  // the casts of the largest product and the bias gradient's partial sums (backend/fp8_workspace.h).
  double workspace = 0;
  double fp8_scaling = 0;  // scales and amax history of every fp8 tensor (nn/fp8_scaling.h)
  double total() const { return weights + gradients + optimizer + activations + workspace + fp8_scaling; }
};

struct Estimate {
  double parameters_formula = 0;
  int64_t parameters_exact = 0;
  double flops_per_iteration = 0;          // under the chosen recompute policy (full: 96 form)
  double flops_without_recompute = 0, flops_with_full_recompute = 0;
  bool has_speed = false;  // a time per iteration or a TFLOP/s target was given; else the next 5 are 0
  double seconds_per_iteration = 0, achieved_tflops_per_gpu = 0, share_of_peak = 0;
  double days_with_recompute = 0, days_without_recompute = 0;  // 8TP/(nX), 6TP/(nX)
  MemoryEstimate memory;
  double korthikanti_layer_bytes = 0, korthikanti_layer_bytes_full_recompute = 0;
  int64_t largest_micro_batch = 0;  // 0: not even 1 fits
  bool fits = false;                 // memory.total() fits at the given micro-batch
  Roofline roofline;                 // one GPU's iteration at the datasheet's rates
  double roofline_tokens_per_second = 0;  // per GPU: its tokens per iteration / roofline.ms
  GpuSpec gpu;
};

// Bytes per parameter for weights, gradients and optimizer state on one of `data_parallel` GPUs.
MemoryEstimate model_state_bytes(double parameters, const std::string& precision, int zero_stage,
                                 int64_t data_parallel);

// The kiln train Config `in` describes, resolved on `in.gpus` ranks: the model and its shape, the
// batch, precision and fp8 (the recompute policy stays `in`'s), the model's default dropout. Its
// architecture() is the model the estimate counts. Not validated (estimate() validates its input).
Config training_config(const EstimateInput& in);

Estimate estimate(const EstimateInput& input);

}  // namespace kiln
