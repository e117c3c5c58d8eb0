// The estimator against worked examples computed by hand (the arithmetic is in the comments).
#include "kiln/perf/estimator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "kiln/nn/activations.h"
#include "kiln/perf/flops.h"
#include "support/error_of.h"
#include "support/small_estimate.h"

namespace kiln {
namespace {

using testing::error_of;

TEST(Estimator, FlopsFormulasOnASmallModel) {
  // 72 B s l h^2 = 72 * 4 * 32 * 2 * 4096 = 75,497,472; (1 + s/6h + V/12lh) = 1 + 1/12 + 1/12 = 7/6.
  EXPECT_DOUBLE_EQ(flops_per_iteration({4, 32, 2, 64, 128}, false), 88080384.0);
  // 96 B s l h^2 = 100,663,296; (1 + 1/12 + V/16lh = 1/16) = 55/48.
  EXPECT_DOUBLE_EQ(flops_per_iteration({4, 32, 2, 64, 128}, true), 115343360.0);
  // 88,080,384 FLOPs in 1 ms on 2 GPUs: 0.044040192 TFLOP/s per GPU.
  EXPECT_DOUBLE_EQ(achieved_tflops(88080384.0, 1e-3, 2), 0.044040192);
}

TEST(Estimator, Gpt3ParametersAndTrainingTime) {
  EstimateInput in;
  in.num_layers = 96;
  in.hidden_size = 12288;
  in.num_attention_heads = 96;
  in.seq_length = 2048;
  in.vocab_size = 51200;
  in.global_batch_size = 1536;
  in.gpus = 1536;
  in.gpu = "a100-80gb";
  in.tflops_per_gpu = 140;
  in.tokens = 300e9;
  in.zero_stage = 3;
  in.recompute = RecomputePolicy::parse("full", "uniform", 1);
  const Estimate e = estimate(in);
  // 12 l h^2 = 12 * 96 * 12288^2 = 173,946,175,488
  // 13 / (12 h) = 13 / 147,456;  (V + s) / (12 l h) = 53,248 / 14,155,776
  // P = 12 l h^2 + 13 l h + (V + s) h = 173,946,175,488 + 15,335,424 + 654,311,424 = 174,615,822,336
  EXPECT_NEAR(e.parameters_formula, 174615822336.0, 1.0);
  // Exact adds the final LayerNorm (2h = 24,576): 174,615,846,912.
  EXPECT_EQ(e.parameters_exact, 174615846912);
  // 8 T P / (n X) = 8 * 3e11 * 174,615,822,336 / (1536 * 1.4e14) s = 1,948,837.3 s = 22.556 days.
  EXPECT_NEAR(e.days_with_recompute, 22.5560, 1e-3);
  EXPECT_NEAR(e.days_without_recompute, 22.5560 * 6 / 8, 1e-3);
  // Korthikanti, one layer, b = 1: s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes.
  EXPECT_DOUBLE_EQ(e.korthikanti_layer_bytes, 2868903936.0);
  EXPECT_DOUBLE_EQ(e.korthikanti_layer_bytes_full_recompute, 2.0 * 2048 * 12288);
  EXPECT_NEAR(e.share_of_peak, 140.0 / 312.0, 1e-12);
}

TEST(Estimator, ModelStateBytesFollowZero) {
  // kiln keeps fp32 gradients: Megatron-LM's "float16 param, fp32 grads" row, 18 bytes per
  // parameter, 6 + 12/d with the optimizer state sharded. 7.5 B parameters, 64-way data parallel.
  const double psi = 7.5e9;
  auto total = [&](int stage) {
    const MemoryEstimate m = model_state_bytes(psi, "bf16", stage, 64);
    return (m.weights + m.gradients + m.optimizer) / 1e9;
  };
  EXPECT_DOUBLE_EQ(total(0), 135.0);                // 18 psi
  EXPECT_DOUBLE_EQ(total(1), 46.40625);             // (6 + 12/64) psi
  EXPECT_DOUBLE_EQ(total(2), 16.875);               // (2 + 16/64) psi
  EXPECT_DOUBLE_EQ(total(3), 2.109375);             // 18 psi / 64
  const MemoryEstimate bf16 = model_state_bytes(1e9, "bf16", 0, 1);
  EXPECT_DOUBLE_EQ(bf16.gradients, 4e9);            // fp32 gradients in mixed precision too
  const MemoryEstimate fp32 = model_state_bytes(1e9, "fp32", 0, 1);  // 4 + 4 + 8 bytes
  EXPECT_DOUBLE_EQ(fp32.weights + fp32.gradients + fp32.optimizer, 16e9);
}

TEST(Estimator, MemoryNeedsNoSpeedInput) {
  EstimateInput in = testing::small_estimate_input();
  in.tflops_per_gpu.reset();
  const Estimate memory_only = estimate(in);
  EXPECT_FALSE(memory_only.has_speed);
  EXPECT_EQ(memory_only.seconds_per_iteration, 0.0);
  EXPECT_EQ(memory_only.days_with_recompute, 0.0);
  in.tflops_per_gpu = 100;
  const Estimate with_speed = estimate(in);
  EXPECT_TRUE(with_speed.has_speed);
  EXPECT_GT(with_speed.seconds_per_iteration, 0.0);
  EXPECT_EQ(memory_only.memory.total(), with_speed.memory.total());
  EXPECT_EQ(memory_only.largest_micro_batch, with_speed.largest_micro_batch);
}

TEST(Estimator, TimeFromMeasuredIterationAndMemoryFromThePlanner) {
  EstimateInput in = testing::small_estimate_input();
  in.tflops_per_gpu.reset();
  in.time_per_iteration_s = 1e-3;
  in.gpu = "h100-sxm";
  in.precision = "tf32";
  const Estimate e = estimate(in);
  EXPECT_DOUBLE_EQ(e.achieved_tflops_per_gpu, 0.088080384);
  GptConfig shape;
  shape.num_layers = 2;
  shape.hidden_size = 64;
  shape.num_heads = 4;
  shape.vocab_size = 128;
  shape.max_position_embeddings = 32;
  EXPECT_EQ(e.memory.activations, static_cast<double>(GptActivations::bytes_needed(shape, 4, 32)));  // tf32: fp32
  const auto workspace = [](int64_t micro) { return 2.0 * static_cast<double>(micro * 4 * 32 * 32) * 4; };
  EXPECT_EQ(e.memory.workspace, workspace(4));
  EXPECT_EQ(e.memory.weights, 4.0 * static_cast<double>(e.parameters_exact));  // fp32: 4 bytes
  // The largest micro-batch fits and one more does not.
  const double capacity = (80.0 - 1.5) * 1073741824.0;
  const double state = e.memory.weights + e.memory.gradients + e.memory.optimizer;
  const auto planned = [&](int64_t micro) {
    return static_cast<double>(GptActivations::bytes_needed(shape, micro, 32)) + workspace(micro);
  };
  EXPECT_LE(state + planned(e.largest_micro_batch), capacity);
  EXPECT_GT(state + planned(e.largest_micro_batch + 1), capacity);
}

// The workspace is the largest scratch of one call; with M = 128 positions (4 runs of 32 rows) the
// LayerNorm backward's partial sums, two rows of C floats a run (layernorm_workspace.h), are
// 2 x 4 x C x 4 bytes, more than the fused attention's one float per query and head wherever C is
// over 16 times the number of heads.
double layernorm_scratch(double C) { return 2.0 * 4 * C * 4; }

TEST(Estimator, AttentionWorkspaceFollowsTheKernelThatRuns) {
  // Head size 64 in bf16 on an H100: the fused kernels, which keep one fp32 per query and head
  // (micro-batch x heads x seq x 4 bytes = 2,048), fewer than the LayerNorm backward's partials.
  EstimateInput in = testing::small_estimate_input();
  in.hidden_size = 256;
  in.num_attention_heads = 4;
  in.gpu = "h100-sxm";
  in.precision = "bf16";
  EXPECT_EQ(estimate(in).memory.workspace, std::max(4.0 * 4 * 32 * 4, layernorm_scratch(256)));
  in.num_attention_heads = 64;  // head size 4: the attention's 32,768 bytes are the most
  EXPECT_EQ(estimate(in).memory.workspace, 4.0 * 64 * 32 * 4);
  // fp16 on a V100 (no sm_80 tensor-core tiles) with head size 80 and 256: the general fused
  // kernels, the same attention workspace.
  in.num_attention_heads = 4;
  in.gpu = "v100";
  in.precision = "fp16";
  in.hidden_size = 320;
  EXPECT_EQ(estimate(in).memory.workspace, std::max(4.0 * 4 * 32 * 4, layernorm_scratch(320)));
  in.hidden_size = 1024;
  EXPECT_EQ(estimate(in).memory.workspace, std::max(4.0 * 4 * 32 * 4, layernorm_scratch(1024)));
  // fp32, and heads wider than 256: the materialised path's two micro-batch x heads x seq^2
  // matrices in the compute dtype, larger than the partials.
  in.precision = "fp32";
  EXPECT_EQ(estimate(in).memory.workspace, 2.0 * 4 * 4 * 32 * 32 * 4);
  in.precision = "fp16";
  in.hidden_size = 4 * 264;
  EXPECT_EQ(estimate(in).memory.workspace, 2.0 * 4 * 4 * 32 * 32 * 2);
}

// Without deterministic attention the tensor-core backward adds dQ into fp32 sums after D (256-byte
// aligned): one float per position and channel, here 4 x 32 x 256 x 4 = 131,072 bytes past D's
// 2,048, the most; the other kernels (general, materialised) have no such sums.
TEST(Estimator, AtomicQueryGradientAddsItsSumsToTheAttentionWorkspace) {
  EstimateInput in = testing::small_estimate_input();
  in.hidden_size = 256;
  in.num_attention_heads = 4;
  in.precision = "bf16";
  in.deterministic_attention = false;
  EXPECT_EQ(estimate(in).memory.workspace, 2048.0 + 4 * 32 * 256 * 4);
  in.hidden_size = 4 * 264;  // heads of 264: the materialised path, as deterministic
  const double materialised = estimate(in).memory.workspace;
  in.deterministic_attention = true;
  EXPECT_EQ(estimate(in).memory.workspace, materialised);
}

TEST(Estimator, LayerNormBackwardScratchIsTwoPartialRowsARun) {
  EstimateInput in = testing::small_estimate_input();
  in.precision = "bf16";
  in.hidden_size = 512;
  in.num_attention_heads = 8;
  EXPECT_EQ(estimate(in).memory.workspace, layernorm_scratch(512));  // 4 runs: 16 KiB
  // GPT-2 124M at micro-batch 64: 65,536 positions, the most runs (1024 of 64 rows), 6 MiB at
  // C = 768, twice the fused attention's 64 x 12 x 1024 floats.
  in.num_layers = 12;
  in.hidden_size = 768;
  in.num_attention_heads = 12;
  in.seq_length = 1024;
  in.micro_batch_size = 64;
  in.global_batch_size = 64;
  EXPECT_EQ(estimate(in).memory.workspace, 2.0 * 1024 * 768 * 4);
}

TEST(Estimator, Fp8AddsTheCastScratchAndTheScalingState) {
  EstimateInput in = testing::small_estimate_input();  // M = micro-batch x seq = 128 positions, C = 64
  in.precision = "bf16";
  const Estimate bf16 = estimate(in);
  // Fused attention's micro-batch x heads x seq floats, as many bytes as the LayerNorm partials.
  EXPECT_EQ(bf16.memory.workspace, 4.0 * 4 * 32 * 4);
  EXPECT_EQ(bf16.memory.workspace, layernorm_scratch(64));
  EXPECT_EQ(bf16.memory.fp8_scaling, 0.0);
  in.fp8_format = "hybrid";
  const Estimate fp8 = estimate(in);
  // The largest cast is mlp.c_fc's backward (M = 128, K = C = 64, N = 4C = 256), one byte an
  // element: dout and its transpose 2 M N = 65,536 and the weight K N = 16,384 (`in` transposed
  // is the codes its forward kept, activations.h); 81,920 bytes, every region a multiple of 256;
  // then the bias gradient's partial sums, one float per column for each 32 rows: 4,096 bytes.
  EXPECT_EQ(fp8.memory.workspace, 81920.0 + 4096.0);
  // 2 layers x 4 products x 3 operands = 24 rows of (scale, 1/scale, amax, fp8 max, 1 amax) fp32,
  // each padded to 8 floats and starting 3 floats in (fp8_scaling.h): (3 + 24 x 8 + 1) x 4 bytes.
  EXPECT_EQ(fp8.memory.fp8_scaling, (3 + 24.0 * 8 + 1) * 4);
  in.fp8_amax_history_len = 16;  // rows of 20 floats, a multiple of 4 already
  EXPECT_EQ(estimate(in).memory.fp8_scaling, (3 + 24.0 * 20 + 1) * 4);
  // Activations: per layer and position the LayerNorm and GELU outputs (6C bf16 values) give way
  // to the products' input codes (7C bytes), plus one shared buffer of LayerNorm output codes (C
  // bytes), one of GELU output codes (4C bytes) and one of the residual gradient's codes in both
  // layouts (2C bytes).
  const double C = 64, M = 128, L = 2;
  EXPECT_EQ(fp8.memory.activations, bf16.memory.activations - (L * 12 * C - 7 * C - L * 7 * C) * M);
  // Everything else is the bf16 run's: same weights and FLOPs.
  EXPECT_EQ(fp8.memory.weights + fp8.memory.gradients + fp8.memory.optimizer,
            bf16.memory.weights + bf16.memory.gradients + bf16.memory.optimizer);
  EXPECT_EQ(fp8.flops_per_iteration, bf16.flops_per_iteration);
  EXPECT_EQ(fp8.share_of_peak, bf16.share_of_peak);  // against the bf16 peak
  EXPECT_LE(fp8.largest_micro_batch, bf16.largest_micro_batch);
}

TEST(Estimator, AnFp8ClassifierAddsItsCastsAndThreeScalingRows) {
  EstimateInput in = testing::small_estimate_input();  // 128 positions, C = 64
  in.precision = "bf16";
  in.fp8_format = "hybrid";
  in.vocab_size = 1000;  // padded to 1024
  const Estimate blocks = estimate(in);
  in.fp8_classifier = true;
  const Estimate classifier = estimate(in);
  // The loss writes the logits' gradient as codes, by rows and by columns, for the classifier's
  // backward (one chunk of M = 128 positions, K = C = 64, N = 1024): 2 M N = 262,144 bytes of
  // activations beside the logits chunk, and wte's codes in both layouts, cast once for every
  // chunk, 2 N K = 131,072 more. The products then cast only ln_f's output, 8,192 bytes, less
  // than c_fc's 81,920 above: the scratch stays.
  EXPECT_EQ(classifier.memory.workspace, blocks.memory.workspace);
  EXPECT_EQ(classifier.memory.activations, blocks.memory.activations + 2.0 * 128 * 1024 + 2.0 * 1024 * 64);
  EXPECT_EQ(classifier.memory.fp8_scaling, (3 + 27.0 * 8 + 1) * 4);  // (2 x 4 + 1) x 3 rows
  // Its products now run at the fp8 rate, each with a pass of its own for the cast of ln_f's output
  // (read 2 bytes, write 1, an element of 128 x 64); wte's cast is a convert of its own, once: read
  // 2 bytes an element of 1024 x 64, write 1 in each layout.
  const auto fp8_rows = [](const Estimate& e) {
    std::map<std::string, double> pass_bytes;
    for (const RooflineOp& op : e.roofline.ops)
      if (op.totals.fp8) pass_bytes[op.totals.op] = op.totals.pass_bytes;
    return pass_bytes;
  };
  const auto bytes_of_row = [](const Estimate& e, const std::string& name) {
    for (const RooflineOp& op : e.roofline.ops)
      if (op.totals.op == name) return op.totals.bytes;
    return 0.0;
  };
  EXPECT_FALSE(fp8_rows(blocks).count("matmul_forward 128x64x1024 fp8"));
  EXPECT_EQ(bytes_of_row(blocks, "convert fp8"), 0.0);
  EXPECT_EQ(fp8_rows(classifier)["matmul_forward 128x64x1024 fp8 weight codes"], 3.0 * 128 * 64);
  EXPECT_EQ(fp8_rows(classifier)["matmul_backward 128x64x1024 fp8 dout codes weight codes"], 3.0 * 128 * 64);
  EXPECT_EQ(bytes_of_row(classifier, "convert fp8"), 4.0 * 1024 * 64);
}

TEST(Estimator, BadInputNamesTheFlag) {
  auto message = [](auto mutate) {
    EstimateInput in = testing::small_estimate_input();
    mutate(in);
    return error_of([&] { estimate(in); });
  };
  EXPECT_NE(message([](EstimateInput& in) { in.num_layers = 0; }).find("--num-layers must be positive"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.hidden_size = -8; }).find("--hidden-size"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.num_attention_heads = 5; }).find("does not divide"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.gpu = "tpu-v5"; }).find("--gpu 'tpu-v5' is not known"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.time_per_iteration_s = 1.0; }).find("not both"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.zero_stage = 4; }).find("--zero-stage"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.gpu = "v100"; }).find("no bf16 tensor cores"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.global_batch_size = 6; }).find("not a multiple"), std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.fp8_format = "e5m2"; }).find("--fp8-format 'e5m2' is not hybrid"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) {
              in.fp8_format = "hybrid";
              in.precision = "fp16";
            }).find("--fp8-format needs --precision bf16, not fp16"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) {
              in.fp8_format = "hybrid";
              in.hidden_size = 72;
            }).find("--hidden-size (72)"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) {
              in.fp8_format = "e4m3";
              in.gpu = "a100-80gb";
            }).find("--gpu a100-80gb has no fp8 tensor cores"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) {
              in.fp8_format = "hybrid";
              in.fp8_amax_history_len = 0;
            }).find("--fp8-amax-history-len"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.fp8_classifier = true; }).find("--fp8-classifier needs --fp8-format"),
            std::string::npos);
  // Sizes past any machine: refused before a count overflows or a per-layer list is built.
  EXPECT_NE(message([](EstimateInput& in) { in.num_layers = int64_t{1} << 30; })
                .find("are too large: 1073741824 layers (at most 65536)"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.seq_length = 3037000500; })
                .find("are too large: the attention scores (micro-batch x heads x seq^2)"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.hidden_size = int64_t{1} << 62; }).find("are too large: parameters"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) {
              in.micro_batch_size = in.global_batch_size = int64_t{1} << 60;
            }).find("are too large: the MLP activation"),
            std::string::npos);
  EXPECT_NE(message([](EstimateInput& in) { in.tokens = INFINITY; }).find("--tokens must be a positive number, got inf"),
            std::string::npos);
}

// The roofline is one GPU's share of the iteration: more GPUs without ZeRO leave each the same
// micro-batches and the whole optimizer; ZeRO-1 splits the optimizer's work, and fp8 runs the
// block products at the fp8 rate.
TEST(Estimator, RooflineOfOneGpusIteration) {
  EstimateInput one = testing::small_estimate_input();
  one.global_batch_size = 8;  // two micro-batches of 4
  const Estimate single = estimate(one);
  EXPECT_GT(single.roofline.ms, 0.0);
  EXPECT_DOUBLE_EQ(single.roofline.ms, single.roofline.compute_bound_ms + single.roofline.memory_bound_ms);
  EXPECT_DOUBLE_EQ(single.roofline_tokens_per_second, 8 * 32 / (single.roofline.ms * 1e-3));
  EXPECT_DOUBLE_EQ(single.roofline.limits.tflops, 989.4);  // h100-sxm, bf16

  EstimateInput two = one;
  two.global_batch_size = 16;
  two.gpus = 2;
  EXPECT_DOUBLE_EQ(estimate(two).roofline.ms, single.roofline.ms);
  two.zero_stage = 1;
  const Estimate sharded = estimate(two);
  double adamw = 0, sharded_adamw = 0;
  for (const RooflineOp& op : single.roofline.ops) adamw += op.totals.op == "adamw_step" ? op.ms : 0.0;
  for (const RooflineOp& op : sharded.roofline.ops) sharded_adamw += op.totals.op == "adamw_step" ? op.ms : 0.0;
  EXPECT_GT(adamw, 0.0);
  EXPECT_DOUBLE_EQ(sharded_adamw, adamw / 2);

  EstimateInput fp8 = one;
  fp8.fp8_format = "hybrid";
  bool any_fp8 = false;
  for (const RooflineOp& op : estimate(fp8).roofline.ops) any_fp8 |= op.totals.fp8;
  EXPECT_TRUE(any_fp8);
}

}  // namespace
}  // namespace kiln
