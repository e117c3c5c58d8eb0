// kiln estimate levers: the configuration as given, then one row per switch, each the estimator's
// own answer for the changed configuration, or the estimator's reason where a change does not apply.
#include "kiln/perf/levers.h"

#include <gtest/gtest.h>

#include <map>

#include "support/small_estimate.h"

namespace kiln {
namespace {

// The small GPT in two micro-batches of 4, with no speed target (levers need none).
EstimateInput small_model() {
  EstimateInput in = testing::small_estimate_input();
  in.global_batch_size = 8;
  in.tflops_per_gpu.reset();
  return in;
}

std::map<std::string, LeverEstimate> by_change(const std::vector<LeverEstimate>& levers) {
  std::map<std::string, LeverEstimate> result;
  for (const LeverEstimate& lever : levers) result.emplace(lever.change, lever);
  return result;
}

TEST(Levers, EachRowIsTheEstimateOfOneChange) {
  const EstimateInput in = small_model();
  const std::vector<LeverEstimate> levers = estimate_levers(in);
  ASSERT_FALSE(levers.empty());
  EXPECT_EQ(levers.front().change, "(as given)");
  const auto rows = by_change(levers);
  EXPECT_EQ(rows.size(), levers.size()) << "each change once";
  for (const char* change : {"(as given)", "--recompute-granularity selective",
                             "--recompute-granularity full --recompute-method uniform", "--precision tf32",
                             "--fp8-format hybrid", "--micro-batch-size 2", "--micro-batch-size 8"})
    EXPECT_TRUE(rows.count(change)) << change;
  EXPECT_FALSE(rows.count("--zero-stage 1")) << "one GPU: nothing to shard";

  const auto same = [](const Estimate& a, const Estimate& b) {
    EXPECT_DOUBLE_EQ(a.memory.total(), b.memory.total());
    EXPECT_DOUBLE_EQ(a.roofline.ms, b.roofline.ms);
    EXPECT_EQ(a.fits, b.fits);
  };
  same(*rows.at("(as given)").estimate, estimate(in));
  EstimateInput selective = in;
  selective.recompute = RecomputePolicy::parse("selective", "", 1);
  same(*rows.at("--recompute-granularity selective").estimate, estimate(selective));
  EstimateInput halved = in;
  halved.micro_batch_size = 2;
  same(*rows.at("--micro-batch-size 2").estimate, estimate(halved));
  // TF32 keeps 4-byte activations and runs its products at half the bf16 rate.
  const Estimate& tf32 = *rows.at("--precision tf32").estimate;
  EXPECT_GT(tf32.memory.activations, rows.at("(as given)").estimate->memory.activations);
  EXPECT_GT(tf32.roofline.ms, rows.at("(as given)").estimate->roofline.ms);
  EXPECT_TRUE(rows.at("(as given)").estimate->fits);
}

// With fp8 given, the classifier's products join or leave it; turning fp8 off takes them along.
TEST(Levers, TheFp8ClassifierIsASwitchOfItsOwn) {
  EstimateInput in = small_model();
  in.fp8_format = "hybrid";
  const auto blocks = by_change(estimate_levers(in));
  ASSERT_TRUE(blocks.count("--fp8-classifier") && blocks.at("--fp8-classifier").estimate);
  EstimateInput classifier = in;
  classifier.fp8_classifier = true;
  EXPECT_DOUBLE_EQ(blocks.at("--fp8-classifier").estimate->memory.total(), estimate(classifier).memory.total());
  const auto both = by_change(estimate_levers(classifier));
  ASSERT_TRUE(both.count("no --fp8-classifier") && both.at("no --fp8-classifier").estimate);
  for (const char* change : {"no --fp8-format", "--precision tf32 (no fp8)"})
    EXPECT_TRUE(both.count(change) && both.at(change).estimate) << change << ": " << both.at(change).not_applicable;
  EXPECT_FALSE(by_change(estimate_levers(small_model())).count("--fp8-classifier")) << "only with fp8";
}

// Larger classifier chunks, where a micro-batch has more positions than one chunk: more logits in
// memory, the same products.
TEST(Levers, LargerLossChunksCostTheirLogits) {
  EstimateInput in = small_model();
  in.vocab_size = 8192;  // logits larger than the buffers they could share memory with
  in.loss_chunk_rows = 16;
  const int64_t positions = in.micro_batch_size * in.seq_length;
  ASSERT_GT(positions, 64);
  const auto rows = by_change(estimate_levers(in));
  ASSERT_TRUE(rows.count("--loss-chunk-rows 64") && rows.at("--loss-chunk-rows 64").estimate);
  const Estimate& larger = *rows.at("--loss-chunk-rows 64").estimate;
  EstimateInput changed = in;
  changed.loss_chunk_rows = 64;
  EXPECT_DOUBLE_EQ(larger.memory.total(), estimate(changed).memory.total());
  EXPECT_GT(larger.memory.activations, rows.at("(as given)").estimate->memory.activations);
  in.loss_chunk_rows = positions;
  for (const LeverEstimate& lever : estimate_levers(in))
    EXPECT_EQ(lever.change.find("--loss-chunk-rows"), std::string::npos) << "a chunk takes the whole micro-batch";
}

// The encoder classifier's loss takes one row a sample (no chunks to enlarge) and it has no tied
// classifier (no --fp8-classifier row); its blocks' fp8 products are a lever like GPT's.
TEST(Levers, TheEncoderClassifierHasNoLossChunksOrFp8Classifier) {
  EstimateInput in = small_model();
  in.model = "encoder-classifier";
  in.loss_chunk_rows = 16;  // fewer than the micro-batch's 128 positions: a GPT would get the row
  const std::vector<LeverEstimate> levers = estimate_levers(in);
  for (const LeverEstimate& lever : levers)
    EXPECT_EQ(lever.change.find("--loss-chunk-rows"), std::string::npos) << lever.change;
  const auto rows = by_change(levers);
  for (const char* change : {"--precision tf32", "--fp8-format hybrid", "--micro-batch-size 2", "--micro-batch-size 8",
                             "--recompute-granularity selective", "--recompute-granularity full --recompute-method uniform"})
    EXPECT_TRUE(rows.count(change) && rows.at(change).estimate) << change;
  in.precision = "bf16";
  in.fp8_format = "hybrid";
  const auto fp8 = by_change(estimate_levers(in));
  EXPECT_FALSE(fp8.count("--fp8-classifier")) << "the encoder has no tied classifier";
  EXPECT_TRUE(fp8.count("no --fp8-format") && fp8.at("no --fp8-format").estimate);
  EXPECT_TRUE(fp8.count("--precision tf32 (no fp8)"));
}

TEST(Levers, ChangesThatDoNotApplySayWhy) {
  EstimateInput in = small_model();
  in.hidden_size = 72;  // fp8 products need multiples of 16
  in.num_attention_heads = 4;
  in.micro_batch_size = 8;  // twice is more than the global batch
  in.gpus = 1;
  const auto rows = by_change(estimate_levers(in));
  EXPECT_FALSE(rows.at("--fp8-format hybrid").estimate);
  EXPECT_NE(rows.at("--fp8-format hybrid").not_applicable.find("--fp8-format needs"), std::string::npos);
  EXPECT_FALSE(rows.at("--micro-batch-size 16").estimate);
  EXPECT_NE(rows.at("--micro-batch-size 16").not_applicable.find("not a multiple"), std::string::npos);

  in.hidden_size = 64;
  in.gpus = 2;
  in.global_batch_size = 16;
  in.zero_stage = 1;
  in.precision = "fp32";
  const auto sharded = by_change(estimate_levers(in));
  for (const char* change : {"--zero-stage 0", "--zero-stage 2", "--zero-stage 3", "--precision bf16",
                             "--precision bf16 --fp8-format hybrid"})
    EXPECT_TRUE(sharded.count(change) && sharded.at(change).estimate) << change;
  EXPECT_FALSE(sharded.count("--zero-stage 1")) << "the stage as given is the first row";
  EXPECT_GT(sharded.at("--zero-stage 0").estimate->memory.optimizer,
            sharded.at("(as given)").estimate->memory.optimizer);
}

}  // namespace
}  // namespace kiln
