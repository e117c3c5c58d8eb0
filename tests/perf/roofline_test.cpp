// The roofline of an iteration: the ops it counts are exactly those the Trainer's step issues,
// their work matches closed forms, and each op takes the slower of its two bounds.
#include "kiln/perf/roofline.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "kiln/nn/gpt.h"
#include "kiln/train/trainer.h"
#include "support/error_of.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

using testing::error_of;

Config mock_gpt(const std::string& precision) {
  Config config = testing::small_gpt_config("", "cpu");
  config.data_path.clear();
  config.mock_data = true;
  config.vocab_size = 61;  // padded to 64
  config.hidden_size = 32;
  config.seq_length = 16;
  config.micro_batch_size = 2;
  config.global_batch_size = 4;  // two micro-batches per iteration
  config.bf16 = precision == "bf16";
  return config;
}

// GPT of 3 layers, 64 wide, 4 heads, vocabulary 100, 32 positions.
std::shared_ptr<const ModelArchitecture> three_layer_gpt() {
  GptConfig gpt;
  gpt.num_layers = 3;
  gpt.hidden_size = 64;
  gpt.num_heads = 4;
  gpt.vocab_size = 100;
  gpt.max_position_embeddings = 32;
  return std::make_shared<GptArchitecture>(gpt);
}

std::map<std::string, OpTotals> by_op(const std::vector<OpTotals>& ops) {
  std::map<std::string, OpTotals> result;
  for (const OpTotals& op : ops)
    if (!op.host_copy) result[op.op] = op;
  return result;
}

// The CPU Trainer's second iteration, op by op as --profile-ops records it, against the count.
void expect_count_matches_trainer(Config config) {
  config.profile_ops = true;
  Trainer trainer(config);
  trainer.train_step();
  trainer.op_timing()->reset_times();
  trainer.train_step();
  const auto measured = by_op(trainer.op_timing()->times());
  const auto counted = by_op(count_iteration_ops(iteration_shape(trainer.config())));
  ASSERT_EQ(measured.size(), counted.size());
  for (const auto& [op, expected] : measured) {
    ASSERT_TRUE(counted.count(op)) << op << " is issued by the step but not counted";
    const OpTotals& got = counted.at(op);
    EXPECT_EQ(got.calls, expected.calls) << op;
    EXPECT_EQ(got.flops, expected.flops) << op;
    EXPECT_EQ(got.bytes, expected.bytes) << op;
    EXPECT_EQ(got.fp8, expected.fp8) << op;
  }
}

TEST(Roofline, CountsTheOpsOfTheTrainersStep) {
  expect_count_matches_trainer(mock_gpt("fp32"));
  Config selective = mock_gpt("bf16");
  selective.recompute_granularity = "selective";
  expect_count_matches_trainer(selective);
  Config full = mock_gpt("bf16");
  full.recompute_granularity = "full";
  full.recompute_method = "uniform";
  expect_count_matches_trainer(full);
  Config fp8 = mock_gpt("bf16");
  fp8.fp8_format = "hybrid";
  expect_count_matches_trainer(fp8);
}

// The encoder classifier on random labelled sequences, through the Model interface as the Trainer
// runs it: its pooler, head and dropout (0.1, its default) counted as the step issues them.
TEST(Roofline, CountsTheOpsOfTheEncoderClassifiersStep) {
  Config encoder = mock_gpt("fp32");
  encoder.model = "encoder-classifier";
  encoder.num_labels = 3;
  expect_count_matches_trainer(encoder);
  encoder.bf16 = true;
  expect_count_matches_trainer(encoder);
}

TEST(Roofline, ProductAndAttentionFlopsFollowTheClosedForms) {
  IterationShape shape;
  shape.architecture = three_layer_gpt();  // vocabulary 100, padded to 128
  shape.micro_batch = 2;
  shape.seq = 32;
  shape.accumulation = 3;
  shape.dtype = DType::BF16;
  double products = 0, attention = 0;
  for (const OpTotals& op : count_iteration_ops(shape)) {
    if (op.op.starts_with("matmul_")) products += op.flops;
    if (op.op.starts_with("attention_")) attention += op.flops;
  }
  // 6 FLOPs per token per weight of the 12 L C^2 block matrices and the (padded) classifier, every
  // product with both gradients; causal attention 2 B T^2 C per layer forward, 2.5 times that back.
  const double tokens = 3.0 * 2 * 32, B = 3.0 * 2, T = 32, C = 64, L = 3;
  EXPECT_DOUBLE_EQ(products, 6 * tokens * (12 * L * C * C + 128 * C));
  EXPECT_DOUBLE_EQ(attention, 3.5 * 2 * B * T * T * C * L);
}

// Each residual add runs inside a projection (nn/block.h): L attention and L MLP products
// +residual a micro-batch, and every LayerNorm is plain (ln_1, ln_2 of each block, ln_f). Full
// recomputation in one chunk replays the forward the same way, less what the chunk keeps: the last
// block's MLP projection is skipped, so L and L - 1 products and 2 L LayerNorms more.
TEST(Roofline, EachResidualAddRunsInsideAProduct) {
  IterationShape shape;
  shape.architecture = three_layer_gpt();
  shape.micro_batch = 2;
  shape.seq = 32;
  shape.accumulation = 3;
  shape.dtype = DType::BF16;
  const int64_t L = 3, micro_batches = 3;
  const std::string attention_projection = "matmul_forward 64x64x64 +bias +residual";
  const std::string mlp_projection = "matmul_forward 64x256x64 +bias +residual";
  auto ops = by_op(count_iteration_ops(shape));
  EXPECT_EQ(ops.at(attention_projection).calls, micro_batches * L);
  EXPECT_EQ(ops.at(mlp_projection).calls, micro_batches * L);
  EXPECT_EQ(ops.count("matmul_forward 64x256x64 +bias"), 0u) << "an MLP projection without its residual";
  EXPECT_EQ(ops.at("layernorm_forward").calls, micro_batches * (2 * L + 1));
  shape.recompute = RecomputePolicy::parse("full", "uniform", L);
  ops = by_op(count_iteration_ops(shape));
  EXPECT_EQ(ops.at(attention_projection).calls, micro_batches * 2 * L);
  EXPECT_EQ(ops.at(mlp_projection).calls, micro_batches * (2 * L - 1));
  EXPECT_EQ(ops.at("layernorm_forward").calls, micro_batches * (2 * L + 1 + 2 * L));
}

TEST(Roofline, ShardedOptimizerStateSharesTheOptimizersWork) {
  IterationShape shape;
  shape.architecture = std::make_shared<GptArchitecture>(GptConfig{});
  shape.dtype = DType::BF16;
  shape.seq = 16;
  const auto whole = by_op(count_iteration_ops(shape));
  shape.optimizer_shards = 4;
  const auto quarter = by_op(count_iteration_ops(shape));
  for (const auto& [op, totals] : whole) {
    const bool optimizer = op == "adamw_step" || op == "sum_of_squares";
    EXPECT_DOUBLE_EQ(quarter.at(op).bytes, optimizer ? totals.bytes / 4 : totals.bytes) << op;
  }
  shape.optimizer_shards = 0;
  EXPECT_NE(error_of([&] { count_iteration_ops(shape); }).find("optimizer shards"),
            std::string::npos);
  shape.optimizer_shards = 1;
  shape.architecture = nullptr;
  EXPECT_EQ(error_of([&] { count_iteration_ops(shape); }), "an iteration needs a model architecture");
}

TEST(Roofline, EachOpTakesTheSlowerOfItsBounds) {
  const DeviceLimits limits{100, 200, 1000};  // TFLOP/s, fp8 TFLOP/s, GB/s
  const std::vector<OpTotals> ops = {
      {.op = "product", .calls = 1, .flops = 1e12, .bytes = 1e9},  // 10 ms of FLOPs, 1 ms of bytes
      // 5 ms of FLOPs at the fp8 rate, 15 ms of bytes
      {.op = "fp8 product", .calls = 1, .flops = 1e12, .bytes = 1.5e10, .fp8 = true},
      {.op = "norm", .calls = 2, .bytes = 2e9},  // 2 ms of bytes
      // 5 ms of FLOPs at the fp8 rate over 4 ms of bytes, then 3 ms of cast passes that nothing overlaps
      {.op = "fp8 product with casts", .calls = 1, .flops = 1e12, .bytes = 7e9, .fp8 = true, .pass_bytes = 3e9},
  };
  const Roofline r = roofline(ops, limits);
  EXPECT_DOUBLE_EQ(r.ms, 35.0);
  EXPECT_DOUBLE_EQ(r.compute_bound_ms, 18.0);
  EXPECT_DOUBLE_EQ(r.memory_bound_ms, 17.0);
  ASSERT_EQ(r.ops.size(), 4u);
  EXPECT_EQ(r.ops[0].totals.op, "fp8 product");  // most time first
  EXPECT_FALSE(r.ops[0].compute_bound);
  EXPECT_TRUE(r.ops[1].compute_bound);
  EXPECT_EQ(r.ops[2].totals.op, "fp8 product with casts");
  EXPECT_DOUBLE_EQ(r.ops[2].ms, 8.0);
  EXPECT_TRUE(r.ops[2].compute_bound);
  EXPECT_DOUBLE_EQ(r.ops[3].ms, 2.0);
  const OpTotals copy{.op = "copy_to_device", .calls = 1, .bytes = 1e9, .host_copy = true};
  EXPECT_NE(error_of([&] { roofline_ms(copy, limits); }).find("crosses the host link"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              roofline(ops, DeviceLimits{100, 0, 1000});
            }).find("no fp8 TFLOP/s limit for 'fp8 product'"),
            std::string::npos);
}

TEST(Roofline, DatasheetLimits) {
  const GpuSpec h100 = *find_gpu_by_key("h100-sxm");
  const DeviceLimits bf16 = datasheet_limits(h100, "bf16");
  EXPECT_DOUBLE_EQ(bf16.tflops, 989.4);
  EXPECT_DOUBLE_EQ(bf16.fp8_tflops, 1978.9);
  EXPECT_DOUBLE_EQ(bf16.bandwidth_gb_per_s, 3350.0);
  EXPECT_DOUBLE_EQ(datasheet_limits(h100, "tf32").tflops, 494.7);
  EXPECT_EQ(error_of([] { datasheet_limits(*find_gpu_by_key("v100"), "bf16"); }),
            "the v100 datasheet gives no bf16 rate");
  // A device that may be unknown: by its name, as kiln train and kiln bench train look it up.
  const auto by_name =
      datasheet_limits_if_any(find_gpu_by_device_name("NVIDIA H100 80GB HBM3"), "fp16");
  ASSERT_TRUE(by_name.has_value());
  EXPECT_DOUBLE_EQ(by_name->tflops, 989.4);
  EXPECT_FALSE(
      datasheet_limits_if_any(find_gpu_by_device_name("CPU emulator of CUDA (sm_90)"), "bf16"));
  EXPECT_FALSE(datasheet_limits_if_any(find_gpu_by_key("v100"), "bf16"));
}

}  // namespace
}  // namespace kiln
