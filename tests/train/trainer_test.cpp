// The Trainer end to end on the CPU: loss falls, resume is bit for bit, accumulation is exact,
// non-finite steps are skipped, checkpoints are validated against the model.
#include "kiln/train/trainer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/perf/estimator.h"
#include "support/error_of.h"
#include "support/recorded_runs.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;

using testing::TempDir;

using Recorder = testing::IterationRecorder;

Config toy_config(const std::string& data) {
  Config config;
  config.data_path = data;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 2;
  config.seq_length = 16;
  config.micro_batch_size = 4;
  config.global_batch_size = 8;
  config.train_iters = 12;
  config.lr = 1e-2;
  config.lr_warmup_iters = 2;
  config.eval_iters = 0;
  config.log_interval = 1;
  return config;
}

TEST(Trainer, LossFallsAndValidationRuns) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.train_iters = 40;
  config.eval_iters = 2;
  config.eval_interval = 20;
  Trainer trainer(config);
  Recorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  ASSERT_EQ(recorder.iterations.size(), 40u);
  EXPECT_NEAR(recorder.iterations.front().lm_loss, std::log(29.0), 0.3);
  EXPECT_LT(recorder.iterations.back().lm_loss, recorder.iterations.front().lm_loss - 1.0);
  ASSERT_EQ(recorder.validations.size(), 2u);  // at 20 and at 40 (the end)
  EXPECT_LT(recorder.validations.back().lm_loss, std::log(29.0) - 1.0);
  EXPECT_DOUBLE_EQ(recorder.validations.back().perplexity,
                   std::exp(recorder.validations.back().lm_loss));
  EXPECT_EQ(trainer.state().consumed_samples, 40 * 8);
  const std::string memory = trainer.memory_summary();
  for (const char* category : {"parameters", "gradients", "Adam first moment", "Adam second moment",
                               "activations", "workspace", "data buffers"})
    EXPECT_NE(memory.find(category), std::string::npos) << category;
}

// ARCHITECTURE.md decision 4: `kiln estimate memory` predicts the buffers `kiln train` allocates.
TEST(Trainer, MemoryPlanIsWhatTheEstimatorPredicts) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 2000, 200);
  for (const auto& [precision, recompute] :
       {std::pair{"fp32", "none"}, {"bf16", "none"}, {"fp16", "full"}, {"bf16+fp8", "none"}}) {
    SCOPED_TRACE(std::string(precision) + ", recompute " + recompute);
    const bool fp8 = std::string(precision) == "bf16+fp8";
    Config config = toy_config(dir.path());
    config.bf16 = std::string(precision) == "bf16" || fp8;
    if (fp8) config.fp8_format = "hybrid";
    config.fp16 = std::string(precision) == "fp16";
    config.recompute_granularity = recompute;
    if (std::string(recompute) == "full") config.recompute_method = "uniform";
    const Trainer trainer(config);
    EstimateInput in;
    in.num_layers = config.num_layers;
    in.hidden_size = config.hidden_size;
    in.num_attention_heads = config.num_attention_heads;
    in.seq_length = config.seq_length;
    in.vocab_size = trainer.config().vocab_size;
    in.global_batch_size = config.global_batch_size;
    in.micro_batch_size = config.micro_batch_size;
    in.precision = fp8 ? "bf16" : precision;
    in.fp8_format = config.fp8_format;
    in.recompute = trainer.config().recompute_policy();
    const MemoryEstimate predicted = estimate(in).memory;
    EXPECT_EQ(predicted.weights, static_cast<double>(trainer.model().params().bytes()));
    EXPECT_EQ(predicted.gradients, static_cast<double>(trainer.model().grads().bytes()));
    EXPECT_EQ(predicted.optimizer,
              static_cast<double>(trainer.optimizer().state_bytes() + trainer.optimizer().master_bytes()));
    EXPECT_EQ(predicted.activations, static_cast<double>(trainer.model().activation_bytes()));
    EXPECT_EQ(predicted.fp8_scaling, fp8 ? static_cast<double>(trainer.model().fp8()->bytes()) : 0.0);
  }
}

// With hidden dropout too: a resumed run draws the masks the uninterrupted one drew
// (nn/dropout_streams.h: they depend on the iteration, not on the process). Returns the
// uninterrupted run's losses.
std::vector<double> expect_resume_bit_for_bit(double hidden_dropout) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.hidden_dropout = hidden_dropout;
  config.save = dir / "ckpt";
  config.save_interval = 6;
  Recorder full;
  {
    Trainer trainer(config);
    trainer.add_observer(&full);
    trainer.run();
  }
  Config resumed_config = toy_config(dir.path());
  resumed_config.hidden_dropout = hidden_dropout;
  resumed_config.load = dir / "ckpt/iter_0000006";
  resumed_config.save = dir / "resumed";
  Recorder resumed;
  {
    Trainer trainer(resumed_config);
    EXPECT_EQ(trainer.state().iteration, 6);
    trainer.add_observer(&resumed);
    trainer.run();
  }
  EXPECT_EQ(resumed.iterations.size(), 6u);
  if (resumed.iterations.size() != 6u) return {};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed.iterations[i].iteration, full.iterations[i + 6].iteration);
    EXPECT_EQ(resumed.iterations[i].lm_loss, full.iterations[i + 6].lm_loss)
        << "iteration " << i + 7;
    EXPECT_EQ(resumed.iterations[i].grad_norm, full.iterations[i + 6].grad_norm);
    EXPECT_EQ(resumed.iterations[i].learning_rate, full.iterations[i + 6].learning_rate);
  }
  EXPECT_EQ(testing::read_file_bytes(dir / "resumed/iter_0000012/model.safetensors"),
            testing::read_file_bytes(dir / "ckpt/iter_0000012/model.safetensors"));
  EXPECT_EQ(testing::read_file_bytes(dir / "resumed/iter_0000012/optimizer.safetensors"),
            testing::read_file_bytes(dir / "ckpt/iter_0000012/optimizer.safetensors"));
  EXPECT_EQ(testing::read_file_bytes(dir / "ckpt/latest_checkpointed_iteration.txt"), "12\n");
  for (const auto& entry : std::filesystem::directory_iterator(dir / "ckpt"))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  std::vector<double> losses;
  for (const IterationStats& stats : full.iterations) losses.push_back(stats.lm_loss);
  return losses;
}

TEST(Trainer, ResumeIsBitForBit) { expect_resume_bit_for_bit(0.0); }

TEST(Trainer, ResumeWithHiddenDropoutIsBitForBit) {
  const std::vector<double> dropped = expect_resume_bit_for_bit(0.1);
  // The masks are drawn: from the first step on, the training loss is not the undropped run's.
  const std::vector<double> kept = expect_resume_bit_for_bit(0.0);
  ASSERT_EQ(dropped.size(), kept.size());
  EXPECT_NE(dropped.front(), kept.front());
}

TEST(Trainer, GradientAccumulationMatchesOneBigMicroBatch) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config big = toy_config(dir.path());
  big.micro_batch_size = 16;
  big.global_batch_size = 16;
  big.train_iters = 3;
  Config accumulated = big;
  accumulated.micro_batch_size = 4;  // 4 micro-batches of 4
  Recorder a, b;
  Trainer big_trainer(big), accumulated_trainer(accumulated);
  big_trainer.add_observer(&a);
  accumulated_trainer.add_observer(&b);
  big_trainer.run();
  accumulated_trainer.run();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(a.iterations[i].lm_loss, b.iterations[i].lm_loss, 1e-5) << i;
    EXPECT_NEAR(a.iterations[i].grad_norm, b.iterations[i].grad_norm,
                1e-5 * a.iterations[i].grad_norm)
        << i;
  }
  const float* pa = big_trainer.model().params().as<float>();
  const float* pb = accumulated_trainer.model().params().as<float>();
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < big_trainer.model().num_parameters(); ++i) {
    diff += (pa[i] - pb[i]) * (pa[i] - pb[i]);
    norm += pa[i] * pa[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
}

TEST(Trainer, LossesDoNotDependOnLoaderWorkers) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  auto losses_with = [&](int64_t workers, int64_t cache) {
    Config config = toy_config(dir.path());
    config.num_workers = workers;
    config.data_cache_samples = cache;
    config.eval_iters = 2;
    config.eval_interval = 4;
    Recorder recorder;
    Trainer trainer(config);
    trainer.add_observer(&recorder);
    trainer.run();
    std::vector<double> losses;
    for (const auto& stats : recorder.iterations) losses.push_back(stats.lm_loss);
    for (const auto& stats : recorder.validations) losses.push_back(stats.lm_loss);
    return losses;
  };
  const std::vector<double> reference = losses_with(0, 0);
  EXPECT_EQ(losses_with(3, 0), reference);
  EXPECT_EQ(losses_with(2, 64), reference);
}

TEST(Trainer, NonFiniteGradientsSkipTheStep) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.init_method_std = 1e30;  // logits overflow: loss and gradients are not finite
  Trainer trainer(config);
  const std::vector<float> before(
      trainer.model().params().as<float>(),
      trainer.model().params().as<float>() + trainer.model().num_parameters());
  const IterationStats stats = trainer.train_step();
  EXPECT_TRUE(stats.skipped);
  EXPECT_EQ(stats.skipped_iterations, 1);
  EXPECT_FALSE(std::isfinite(stats.grad_norm));
  // As in Megatron, "nan iterations" counts non-finite losses; here only the gradients overflow.
  ASSERT_TRUE(std::isfinite(stats.lm_loss));
  EXPECT_EQ(stats.nan_iterations, 0);
  for (int64_t i = 0; i < trainer.model().num_parameters(); ++i)
    ASSERT_EQ(trainer.model().params().as<float>()[i], before[i]);
}

TEST(Trainer, CheckpointOfAnotherShapeIsRejectedByName) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.train_iters = 1;
  config.lr_warmup_iters = 0;
  config.save = dir / "ckpt";
  Trainer(config).run();
  Config wider = toy_config(dir.path());
  wider.hidden_size = 48;
  wider.load = dir / "ckpt";
  EXPECT_NE(error_of([&] {
              Trainer trainer(wider);
            }).find("tensor 'wte.weight' has shape [29, 32] but the model needs [29, 48]"),
            std::string::npos);
  Config deeper = toy_config(dir.path());
  deeper.num_layers = 3;
  deeper.load = dir / "ckpt";
  EXPECT_NE(error_of([&] { Trainer trainer(deeper); }).find("tensor 'h.2.ln_1.weight' is missing"),
            std::string::npos);
  Config shallower = toy_config(dir.path());
  shallower.num_layers = 1;
  shallower.load = dir / "ckpt";
  EXPECT_NE(error_of([&] {
              Trainer trainer(shallower);
            }).find("tensor 'h.1.attn.c_attn.bias' does not exist in this model (16 tensors); wrong model or model shape?"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Config missing = toy_config(dir.path());
              missing.load = dir / "nothing";
              Trainer trainer(missing);
            }).find("does not exist"),
            std::string::npos);
}

TEST(Trainer, AFailedSaveLeavesThePreviousCheckpointAndNoTemporaryFiles) {
  // The child must start single-threaded (OpenMP and loader threads do not survive fork).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.train_iters = 1;
  config.lr_warmup_iters = 0;
  config.save = dir / "ckpt";
  Trainer(config).run();  // iteration 1 saved
  // In a child process, cap the size of written files (a real I/O failure, as on a full disk) and
  // resume to iteration 2: its save must fail with an error and leave iteration 1 in place.
  const auto resume_on_a_full_disk = [&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{16 * 1024, 16 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    Config resume = config;
    resume.train_iters = 2;
    resume.load = config.save;
    bool failed = false;
    try {
      Trainer(resume).run();
    } catch (const Error& error) {
      failed = std::string(error.what()).find("cannot write") != std::string::npos;
    }
    int entries = 0;
    for (const auto& entry : std::filesystem::directory_iterator(config.save)) {
      const std::string name = entry.path().filename().string();
      entries += name == "iter_0000001" || name == "latest_checkpointed_iteration.txt" ? 1 : 100;
    }
    std::exit(failed && entries == 2 &&
                      testing::read_file_bytes(config.save + "/latest_checkpointed_iteration.txt") == "1\n"
                  ? 0
                  : 1);
  };
  EXPECT_EXIT(resume_on_a_full_disk(), ::testing::ExitedWithCode(0), "");
}

TEST(Trainer, TokensBeyondTheVocabularyAreRejected) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 20000, 2000);
  Config config = toy_config(dir.path());
  config.vocab_size = 20;  // the data holds ids up to 28
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("outside the vocabulary [0, 20)"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
