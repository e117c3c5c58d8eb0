// Mixed precision end to end, on every back-end: bf16 and fp16 runs follow the fp32 loss curve (on
// CUDA bf16 also with the attention backward adding dQ atomically), and on CUDA so does TF32,
// fp16 with a far too large loss scale skips the overflowing steps, backs the scale off and then
// trains, and a bf16 run resumes bit for bit (the fp32 master weights come from the checkpoint).
#include <gtest/gtest.h>

#include <cmath>

#include "support/recorded_runs.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

using testing::read_file_bytes;
using testing::largest_loss_difference;
using testing::train_and_record;

Config small_gpt(const std::string& data, const std::string& device, const std::string& precision) {
  Config config = testing::small_gpt_config(data, device);
  config.bf16 = precision == "bf16";
  config.fp16 = precision == "fp16";
  return config;
}

class MixedPrecision : public testing::ToyDataRunTest {};

TEST_P(MixedPrecision, Bf16AndFp16FollowTheFp32LossCurve) {
  const std::vector<IterationStats> fp32 = train_and_record(small_gpt(dir_.path(), GetParam(), "fp32"));
  Config fp16_config = small_gpt(dir_.path(), GetParam(), "fp16");
  fp16_config.initial_loss_scale = 4096;  // small enough that no step overflows here
  Config atomic_config = small_gpt(dir_.path(), GetParam(), "bf16");
  atomic_config.deterministic_attention = false;  // no effect on the CPU
  for (const Config& config : {small_gpt(dir_.path(), GetParam(), "bf16"), fp16_config, atomic_config}) {
    const std::vector<IterationStats> mixed = train_and_record(config);
    ASSERT_EQ(mixed.size(), fp32.size());
    const double worst = largest_loss_difference(mixed, fp32);
    for (size_t i = 0; i < fp32.size(); ++i)
      EXPECT_FALSE(mixed[i].skipped) << config.precision_name() << " iteration " << i + 1;
    // Rounding to 8 (bf16) or 11 (fp16) significant bits moves each loss by far less than the
    // run's own progress (about 0.8 here): on the CPU by 9e-4 (bf16) and 1e-4 (fp16) at most; the
    // bounds leave room for a GPU's different rounding of intermediates.
    EXPECT_LT(worst, config.bf16 ? 0.02 : 0.005) << config.precision_name();
    EXPECT_NE(mixed.back().lm_loss, fp32.back().lm_loss) << config.precision_name() << " really ran in fp32";
  }
  EXPECT_LT(fp32.back().lm_loss, fp32.front().lm_loss - 0.5);
}

// TF32 (CUDA only): fp32 training whose matrix products round their inputs to 10 mantissa bits.
TEST_P(MixedPrecision, Tf32FollowsTheFp32LossCurve) {
  if (GetParam() == "cpu") GTEST_SKIP() << "TF32 is a CUDA mode";
  const std::vector<IterationStats> fp32 = train_and_record(small_gpt(dir_.path(), GetParam(), "fp32"));
  Config config = small_gpt(dir_.path(), GetParam(), "fp32");
  config.tf32 = true;
  const std::vector<IterationStats> tf32 = train_and_record(config);
  ASSERT_EQ(tf32.size(), fp32.size());
  // About fp16's input rounding (11 significant bits), on the products alone: fp16's bound.
  EXPECT_LT(largest_loss_difference(tf32, fp32), 0.005);
  EXPECT_NE(tf32.back().lm_loss, fp32.back().lm_loss) << "the products really ran in TF32";
  EXPECT_LT(tf32.back().lm_loss, tf32.front().lm_loss - 0.5);
}

TEST_P(MixedPrecision, Fp16WithAHugeLossScaleSkipsOverflowsBacksOffAndRecovers) {
  Config config = small_gpt(dir_.path(), GetParam(), "fp16");
  config.initial_loss_scale = 1e12;  // dlogits = (p - onehot) x scale / tokens overflows fp16 (65504)
  config.train_iters = 40;
  const std::vector<IterationStats> steps = train_and_record(config);
  ASSERT_EQ(steps.size(), 40u);
  size_t last_skipped = 0;
  int64_t skipped = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i > 0) {
      // Megatron's hysteresis (2): the first overflow keeps the scale, every later one halves it.
      const bool halved = steps[i - 1].skipped && skipped >= 2;
      EXPECT_EQ(steps[i].loss_scale, halved ? steps[i - 1].loss_scale / 2 : steps[i - 1].loss_scale)
          << "iteration " << i + 1;
    }
    skipped += steps[i].skipped;
    if (steps[i].skipped) last_skipped = i + 1;
    EXPECT_EQ(steps[i].skipped_iterations, skipped) << "the log line's count is the real one";
  }
  EXPECT_TRUE(steps.front().skipped);
  EXPECT_GT(skipped, 5);
  EXPECT_LT(last_skipped, 30u) << "the scale settles and training goes on";
  EXPECT_LT(steps.back().loss_scale, 1e12);
  for (size_t i = last_skipped; i < steps.size(); ++i) EXPECT_TRUE(std::isfinite(steps[i].lm_loss));
  EXPECT_LT(steps.back().lm_loss, steps.front().lm_loss - 0.3) << "the applied steps train the model";
}

TEST_P(MixedPrecision, Bf16ResumeIsBitForBit) {
  Config config = small_gpt(dir_.path(), GetParam(), "bf16");
  config.train_iters = 8;
  config.save = dir_ / "ckpt";
  config.save_interval = 4;
  const std::vector<IterationStats> full = train_and_record(config);
  Config resumed_config = config;
  resumed_config.load = dir_ / "ckpt/iter_0000004";
  resumed_config.save = dir_ / "resumed";
  testing::expect_resumed_bit_for_bit(train_and_record(resumed_config), full, 4);
  // The checkpoint holds the fp32 master weights, so the files are identical too.
  EXPECT_EQ(read_file_bytes(dir_ / "resumed/iter_0000008/model.safetensors"),
            read_file_bytes(dir_ / "ckpt/iter_0000008/model.safetensors"));
  EXPECT_EQ(read_file_bytes(dir_ / "resumed/iter_0000008/optimizer.safetensors"),
            read_file_bytes(dir_ / "ckpt/iter_0000008/optimizer.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MixedPrecision, ::testing::ValuesIn(testing::all_backend_names()));

}  // namespace
}  // namespace kiln
