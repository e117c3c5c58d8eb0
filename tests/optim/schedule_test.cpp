#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kiln/core/error.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/loss_scaler.h"
#include "kiln/optim/lr_schedule.h"

namespace kiln {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule schedule{1.0f, 0.1f, 10, 110, LrDecayStyle::Cosine};
  EXPECT_FLOAT_EQ(schedule.at(1), 0.1f);
  EXPECT_FLOAT_EQ(schedule.at(10), 1.0f);
  EXPECT_FLOAT_EQ(schedule.at(60), 0.1f + 0.9f * 0.5f);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(schedule.at(35), 0.1 + 0.9 * 0.5 * (std::cos(std::numbers::pi * 0.25) + 1), 1e-6);
  EXPECT_FLOAT_EQ(schedule.at(110), 0.1f);
  EXPECT_FLOAT_EQ(schedule.at(500), 0.1f);
}

TEST(LrSchedule, LinearAndConstant) {
  LrSchedule linear{2.0f, 0.0f, 0, 100, LrDecayStyle::Linear};
  EXPECT_FLOAT_EQ(linear.at(25), 1.5f);
  EXPECT_FLOAT_EQ(linear.at(100), 0.0f);
  LrSchedule constant{2.0f, 0.0f, 4, 100, LrDecayStyle::Constant};
  EXPECT_FLOAT_EQ(constant.at(2), 1.0f);
  EXPECT_FLOAT_EQ(constant.at(1000), 2.0f);
  EXPECT_THROW(parse_lr_decay_style("exponential"), Error);
}

TEST(LossScaler, BacksOffAfterHysteresisAndGrowsAfterWindow) {
  LossScalerConfig config;
  config.dynamic = true;
  config.initial_scale = 1024;
  config.growth_interval = 3;
  config.hysteresis = 2;
  LossScaler scaler(config);
  EXPECT_TRUE(scaler.update(true));   // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_TRUE(scaler.update(true));   // second: halves
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_FALSE(scaler.update(false)); // third clean step in the window: doubles
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.state().hysteresis_tracker, 2);
}

TEST(LossScaler, NeverBelowMinimumAndStaticNeverChanges) {
  LossScalerConfig config;
  config.dynamic = true;
  config.initial_scale = 4;
  config.min_scale = 2;
  config.hysteresis = 1;
  LossScaler scaler(config);
  for (int i = 0; i < 5; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2);
  LossScaler fixed = LossScaler::fixed(128);
  EXPECT_TRUE(fixed.update(true));
  EXPECT_EQ(fixed.scale(), 128);
}

TEST(ClipCoefficient, ScalesOnlyAboveTheLimit) {
  EXPECT_FLOAT_EQ(clip_coefficient(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0f), 0.25, 1e-6);
  EXPECT_FLOAT_EQ(clip_coefficient(4.0, 0.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_coefficient(NAN, 1.0f), 1.0f);
}

}  // namespace
}  // namespace kiln
