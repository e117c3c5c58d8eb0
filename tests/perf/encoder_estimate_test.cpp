// `kiln estimate --model encoder-classifier`: the estimator reads the encoder classifier's
// architecture (nn/encoder_classifier.h) for its counts, FLOPs and memory, and counts the ops of
// the model it builds; the closed forms are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/nn/encoder_classifier.h"
#include "kiln/perf/estimator.h"
#include "kiln/perf/flops.h"
#include "kiln/train/model_kinds.h"
#include "support/error_of.h"
#include "support/kiln_process.h"

namespace kiln {
namespace {

using testing::error_of;

// 2 layers, 64 wide, 4 heads, sequence 32, vocabulary 128 (a multiple of the padding, 64), 2
// intermediate layers, 3 labels; one micro-batch of 4 in bf16, no speed target.
EstimateInput small_encoder() {
  EstimateInput in;
  in.model = "encoder-classifier";
  in.num_layers = 2;
  in.hidden_size = 64;
  in.num_attention_heads = 4;
  in.seq_length = 32;
  in.vocab_size = 128;
  in.num_intermediate_layers = 2;
  in.num_labels = 3;
  in.global_batch_size = 4;
  in.micro_batch_size = 4;
  return in;
}

// The same model as kiln train's Config holds it.
Config small_encoder_config() {
  Config config;
  config.model = "encoder-classifier";
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.seq_length = 32;
  config.vocab_size = 128;
  config.num_intermediate_layers = 2;
  config.num_labels = 3;
  config.resolve();
  return config;
}

std::map<std::string, OpTotals> ops_by_name(const Roofline& roofline) {
  std::map<std::string, OpTotals> ops;
  for (const RooflineOp& op : roofline.ops) ops[op.totals.op] = op.totals;
  return ops;
}

TEST(EncoderEstimate, ParametersAreTheArchitecturesCountAndTheClosedForm) {
  const Estimate e = estimate(small_encoder());
  const EncoderArchitecture architecture(encoder_config(small_encoder_config()));
  EXPECT_EQ(e.parameters_exact, architecture.num_parameters());
  // By the layout: word embeddings V C = 8,192, positions s C = 2,048 and two token types 2 C = 128;
  // each block 12 C^2 + 13 C = 49,984, two of them 99,968; two intermediate layers C^2 + C = 4,160
  // each, 8,320; the final LayerNorm 2 C = 128; the pooler and the head's dense layer 4,160 each;
  // the projection to 3 labels 3 C + 3 = 195. In all 127,299.
  EXPECT_EQ(e.parameters_exact, 127299);
  // The closed form: GPT's 12 l h^2 + 13 l h + (V + s) h = 98,304 + 1,664 + 10,240 = 110,208, plus
  // (J + 2) h^2 + (J + 6) h + (h + 1) L = 16,384 + 512 + 195 = 17,091: the same 127,299.
  EXPECT_DOUBLE_EQ(e.parameters_formula, 127299.0);
  // A vocabulary of 100 is padded to 128: the exact count keeps the 28 padding rows, the closed form not.
  EstimateInput unpadded = small_encoder();
  unpadded.vocab_size = 100;
  const Estimate u = estimate(unpadded);
  EXPECT_EQ(u.parameters_exact, 127299);
  EXPECT_DOUBLE_EQ(u.parameters_formula, 127299.0 - 28 * 64);
  // bf16: 2-byte weights, fp32 gradients.
  EXPECT_EQ(e.memory.weights, 2.0 * 127299);
  EXPECT_EQ(e.memory.gradients, 4.0 * 127299);
}

TEST(EncoderEstimate, ActivationsAndFlopsAreTheArchitectures) {
  EstimateInput in = small_encoder();
  in.global_batch_size = 8;  // two micro-batches of 4
  const Estimate e = estimate(in);
  const EncoderConfig encoder = encoder_config(small_encoder_config());
  EXPECT_EQ(e.memory.activations, static_cast<double>(EncoderActivations::bytes_needed(encoder, 4, 32, DType::BF16)));
  EXPECT_EQ(e.memory.activations,
            static_cast<double>(EncoderArchitecture(encoder).activation_bytes(4, 32, {}, DType::BF16, 4096, nullptr)));
  // One row of logits a sample: the loss's chunks do not change them.
  in.loss_chunk_rows = 16;
  EXPECT_EQ(estimate(in).memory.activations, e.memory.activations);
  // perf/flops.h's encoder form: per sample s (l (24 h^2 + 4 s h) + 2 J h^2) + 4 h^2 + 2 h L
  // = 32 x (2 x (98,304 + 8,192) + 16,384) + 16,384 + 384 = 7,356,800 forward FLOPs; x 3 x 8
  // samples = 176,563,200, x 4 x 8 with full recomputation = 235,417,600.
  const EncoderFlopsShape shape{8, 32, 2, 64, 2, 3};
  EXPECT_DOUBLE_EQ(e.flops_without_recompute, encoder_flops_per_iteration(shape, false));
  EXPECT_DOUBLE_EQ(e.flops_with_full_recompute, encoder_flops_per_iteration(shape, true));
  EXPECT_DOUBLE_EQ(e.flops_without_recompute, 176563200.0);
  EXPECT_DOUBLE_EQ(e.flops_with_full_recompute, 235417600.0);
  EXPECT_DOUBLE_EQ(e.flops_per_iteration, e.flops_without_recompute);
}

// The roofline counts the model kiln builds: the pooler's gather of the first positions and its
// tanh, a head to the labels, and no classifier over the vocabulary (1000, padded to 1024).
TEST(EncoderEstimate, RooflineCountsThePoolerAndNoVocabularyClassifier) {
  EstimateInput in = small_encoder();
  in.vocab_size = 1000;
  in.global_batch_size = 8;  // two micro-batches of 4
  const auto ops = ops_by_name(estimate(in).roofline);
  for (const char* op : {"gather_rows", "gather_rows_backward", "tanh_forward", "tanh_backward"})
    ASSERT_TRUE(ops.count(op)) << op;
  EXPECT_EQ(ops.at("gather_rows").calls, 2);  // once a micro-batch
  EXPECT_EQ(ops.at("tanh_forward").calls, 2);
  EXPECT_TRUE(ops.count("matmul_forward 4x64x3 +bias")) << "the head's projection of 4 samples to 3 labels";
  double products = 0, attention = 0, attention_forward = 0;
  for (const auto& [name, totals] : ops) {
    EXPECT_EQ(name.find("1024"), std::string::npos) << name << ": a product over the vocabulary";
    if (name.starts_with("matmul_")) products += totals.flops;
    if (name.starts_with("attention_")) attention += totals.flops;
    if (name.starts_with("attention_forward")) attention_forward += totals.flops;
  }
  // Every product with both gradients, 6 FLOPs a weight: per token the blocks' 12 l C^2 and the
  // intermediate layers' J C^2, per sample the pooler's and dense layer's 2 C^2 and the projection's
  // C L: 6 x (256 x 106,496 + 8 x 8,384) = 163,980,288.
  EXPECT_DOUBLE_EQ(products, 163980288.0);
  // Bidirectional attention, 4 B T^2 C a layer forward (no causal half), 2.5 times that back.
  const double B = 8, T = 32, C = 64, L = 2;
  EXPECT_DOUBLE_EQ(attention, 3.5 * 4 * B * T * T * C * L);
  // The encoder form counts the attention as three forwards: products + 3 x attention forward.
  EXPECT_DOUBLE_EQ(products + 3 * attention_forward,
                   encoder_flops_per_iteration(EncoderFlopsShape{8, 32, 2, 64, 2, 3}, false));
}

TEST(EncoderEstimate, Fp8AndRecomputationAsTheModelDoes) {
  // fp8: the blocks' input codes kept (activations) and the scaling state (2 layers x 4 products x 3
  // operands), both as the model takes them; --fp8-classifier names what the encoder lacks.
  EstimateInput fp8 = small_encoder();
  fp8.precision = "bf16";
  fp8.fp8_format = "hybrid";
  const Estimate e8 = estimate(fp8);
  const Config fp8_config = training_config(fp8);
  const std::optional<Fp8Recipe> recipe = fp8_config.fp8_recipe();
  ASSERT_TRUE(recipe.has_value());
  EXPECT_EQ(e8.memory.fp8_scaling, static_cast<double>(Fp8Scaling::state_bytes(2, *recipe)));
  EXPECT_EQ(e8.memory.activations,
            static_cast<double>(fp8_config.architecture()->activation_bytes(
                fp8.micro_batch_size, fp8.seq_length, fp8.recompute, DType::BF16, fp8.loss_chunk_rows, &*recipe)));
  EstimateInput bf16 = fp8;
  bf16.fp8_format.clear();
  // The LayerNorms and c_fc keep 1-byte codes where bf16 keeps 2-byte outputs, and the products
  // keep their inputs' codes transposed besides: another layout, smaller at this shape.
  EXPECT_LT(e8.memory.activations, estimate(bf16).memory.activations);
  fp8.fp8_classifier = true;
  EXPECT_EQ(error_of([&] { estimate(fp8); }),
            "--fp8-classifier: the encoder-classifier has no tied classifier (its pooler and head stay in the compute "
            "dtype); --fp8-format alone runs its blocks' products in fp8");
  // Recomputation: the architecture's activation bytes under the policy, less than keeping everything.
  const Estimate kept = estimate(small_encoder());
  for (const RecomputePolicy& policy :
       {RecomputePolicy::parse("full", "uniform", 1), RecomputePolicy::parse("selective", "", 1)}) {
    EstimateInput recomputed = small_encoder();
    recomputed.recompute = policy;
    const Estimate e = estimate(recomputed);
    EXPECT_LT(e.memory.activations, kept.memory.activations) << policy.describe();
    EXPECT_EQ(e.memory.activations,
              static_cast<double>(training_config(recomputed).architecture()->activation_bytes(
                  recomputed.micro_batch_size, recomputed.seq_length, policy, DType::BF16, recomputed.loss_chunk_rows,
                  nullptr)))
        << policy.describe();
  }
  EstimateInput labels = small_encoder();
  labels.num_labels = 1;
  EXPECT_EQ(error_of([&] { estimate(labels); }), "--num-labels must be at least 2, got 1");
  EstimateInput unknown = small_encoder();
  unknown.model = "vit";
  EXPECT_EQ(error_of([&] { estimate(unknown); }),
            "--model 'vit' is not a model kiln builds; choose one of gpt, encoder-classifier");
}

// The seed lab's model: 18 layers, hidden 1280, 20 heads, sequence 512, vocabulary 30000, 2
// intermediate layers, 2 labels.
TEST(EncoderEstimate, TheLabsShapeHasAbout400MillionParameters) {
  EstimateInput in;
  in.model = "encoder-classifier";
  in.num_layers = 18;
  in.hidden_size = 1280;
  in.num_attention_heads = 20;
  in.seq_length = 512;
  in.vocab_size = 30000;
  in.global_batch_size = 5;
  in.micro_batch_size = 5;
  const Estimate e = estimate(in);
  EXPECT_GE(e.parameters_exact, 380'000'000);
  EXPECT_LE(e.parameters_exact, 400'000'000);
  // 12 l h^2 + 13 l h + (V + s) h = 353,894,400 + 299,520 + 39,055,360 = 393,249,280, plus
  // 4 h^2 + 8 h + 2 (h + 1) = 6,553,600 + 10,240 + 2,562: 399,815,682; the exact count adds the 16
  // padding rows of the vocabulary (30016), 20,480.
  EXPECT_DOUBLE_EQ(e.parameters_formula, 399815682.0);
  EXPECT_EQ(e.parameters_exact, 399836162);
}

TEST(EncoderEstimate, ThroughTheBinary) {
  const std::string encoder =
      "estimate memory --model encoder-classifier --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 32 --vocab-size 128 --num-intermediate-layers 2 --num-labels 3 --global-batch-size 4 "
      "--micro-batch-size 4 --precision bf16";
  const testing::CommandResult json = testing::run_kiln(encoder + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto out = nlohmann::json::parse(json.output);
  EXPECT_EQ(out["model"], "encoder-classifier");
  EXPECT_EQ(out["parameters_exact"].get<int64_t>(), 127299);
  const testing::CommandResult table = testing::run_kiln(encoder);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("| encoder classifier: 2 layers, hidden 64, 4 heads, 2 intermediate layers, 3 labels"),
            std::string::npos)
      << table.output;
  // One intermediate layer fewer: C^2 + C = 4,160 parameters fewer.
  const testing::CommandResult one = testing::run_kiln(
      "estimate memory --model encoder-classifier --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 32 --vocab-size 128 --num-intermediate-layers 1 --num-labels 3 --global-batch-size 4 "
      "--micro-batch-size 4 --precision bf16 --json");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(nlohmann::json::parse(one.output)["parameters_exact"].get<int64_t>(), 127299 - 4160);

  const testing::CommandResult fp8 = testing::run_kiln(encoder + " --fp8-format hybrid --fp8-classifier");
  EXPECT_EQ(fp8.exit_code, 1);
  EXPECT_NE(fp8.output.find("kiln: error: --fp8-classifier: the encoder-classifier has no tied classifier"),
            std::string::npos)
      << fp8.output;
  const testing::CommandResult recompute =
      testing::run_kiln(encoder + " --recompute-granularity full --recompute-method uniform");
  EXPECT_EQ(recompute.exit_code, 0) << recompute.output;
}

}  // namespace
}  // namespace kiln
