// The encoder classifier in every precision, end to end on every back-end, with its default
// dropout 0.1 (the same masks in every run): bf16 and fp16 follow the fp32 loss curve, and on
// CUDA so does TF32. GPT's counterpart is mixed_precision_test.cpp; the encoder's fp8 is
// encoder_fp8_training_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>

#include "support/backends.h"
#include "support/pool_texts.h"
#include "support/recorded_runs.h"
#include "support/small_encoder.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::largest_loss_difference;
using testing::train_and_record;

class EncoderMixedPrecision : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = testing::backend_skip_reason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
    testing::write_pool_texts(dir_ / "train.jsonl", 256, 1);
  }
  // One intermediate layer, the encoder's default dropout.
  Config config(const std::string& precision) const {
    Config config = testing::small_encoder_config(dir_.path(), GetParam(), 1, 0.1);
    config.bf16 = precision == "bf16";
    config.fp16 = precision == "fp16";
    config.tf32 = precision == "tf32";
    if (config.fp16) config.initial_loss_scale = 4096;  // small enough that no step overflows here
    return config;
  }
  testing::TempDir dir_;
};

TEST_P(EncoderMixedPrecision, EveryPrecisionFollowsTheFp32LossCurve) {
  const std::vector<IterationStats> fp32 = train_and_record(config("fp32"));
  EXPECT_LT(fp32.back().lm_loss, fp32.front().lm_loss - 0.2) << "it learns";
  std::vector<std::string> precisions = {"bf16", "fp16"};
  if (GetParam() == "cuda") precisions.push_back("tf32");  // a CUDA mode: the CPU computes in fp32
  for (const std::string& precision : precisions) {
    const std::vector<IterationStats> run = train_and_record(config(precision));
    ASSERT_EQ(run.size(), fp32.size()) << precision;
    for (size_t i = 0; i < run.size(); ++i) EXPECT_FALSE(run[i].skipped) << precision << " iteration " << i + 1;
    const double worst = largest_loss_difference(run, fp32);
    std::printf("encoder %s on %s: largest loss difference to fp32 %.5f (fp32 from %.3f to %.3f)\n",
                precision.c_str(), GetParam().c_str(), worst, fp32.front().lm_loss, fp32.back().lm_loss);
    // GPT's bounds (mixed_precision_test.cpp): bf16 rounds to 8 significant bits, fp16 and TF32's
    // product inputs to 11.
    EXPECT_LT(worst, precision == "bf16" ? 0.02 : 0.005) << precision;
    EXPECT_NE(run.back().lm_loss, fp32.back().lm_loss) << precision << " really ran in another precision";
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, EncoderMixedPrecision, ::testing::ValuesIn(testing::all_backend_names()));

}  // namespace
}  // namespace kiln
