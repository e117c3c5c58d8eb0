// Megatron-style GPT samples over indexed datasets: splits, windows, shuffling, caching, blending,
// and the whole validation split read once.
#include "kiln/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <thread>

#include "kiln/backend/registry.h"
#include "kiln/nn/gpt.h"
#include "kiln/train/trainer.h"
#include "kiln/train/training_data.h"
#include "support/error_of.h"
#include "support/gloo_ranks.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

// Document d holds tokens base + 100 d, base + 100 d + 1, ... (length 5 + d % 7), so any window
// tells where it came from.
void write_documents(const std::string& prefix, int documents, int32_t base = 0) {
  IndexedDatasetWriter writer(prefix, IndexedDType::Int32);
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> tokens;
    for (int t = 0; t < 5 + d % 7; ++t) tokens.push_back(base + 100 * d + t);
    writer.add_document(tokens);
  }
  writer.finish();
}

TEST(GptDataset, SplitsFollowMegatronsRounding) {
  const auto ranges = split_ranges(parse_split("949,50,1"), 1000);
  EXPECT_EQ(ranges[0], (std::pair<int64_t, int64_t>{0, 949}));
  EXPECT_EQ(ranges[1], (std::pair<int64_t, int64_t>{949, 999}));
  EXPECT_EQ(ranges[2], (std::pair<int64_t, int64_t>{999, 1000}));
  const auto two = split_ranges(parse_split("8,2"), 10);
  EXPECT_EQ(two[1], (std::pair<int64_t, int64_t>{8, 10}));
  EXPECT_EQ(two[2], (std::pair<int64_t, int64_t>{10, 10}));
  EXPECT_NE(error_of([] { parse_split("9,x,1"); }).find("'split'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_split("0,0"); }).find("sums to zero"), std::string::npos);
}

TEST(GptDataset, SamplesAreWindowsOfTheShuffledDocumentStream) {
  TempDir dir;
  write_documents(dir / "d", 40);
  auto data = std::make_shared<const IndexedDataset>(dir / "d", 10000);
  const int64_t seq = 6, samples = 100;
  GptDataset dataset(data, dir / "d", {0, 36}, seq, samples, 7);
  std::vector<int32_t> tokens(seq), targets(seq);
  std::set<int32_t> seen_documents;
  for (int64_t i = 0; i < samples; ++i) {
    dataset.sample(i, tokens, targets);
    for (int64_t t = 0; t + 1 < seq; ++t) EXPECT_EQ(targets[static_cast<size_t>(t)], tokens[static_cast<size_t>(t) + 1]);
    for (int32_t token : tokens) {
      EXPECT_LT(token / 100, 36) << "a validation/test document leaked into the train split";
      seen_documents.insert(token / 100);
    }
    // Inside one document tokens are consecutive; a document change starts at offset 0.
    for (int64_t t = 1; t < seq; ++t) {
      const int32_t previous = tokens[static_cast<size_t>(t) - 1], current = tokens[static_cast<size_t>(t)];
      EXPECT_TRUE(current == previous + 1 || current % 100 == 0) << previous << " -> " << current;
    }
  }
  EXPECT_EQ(seen_documents.size(), 36u);
  // Built from the cache, and built afresh after the data changed: same reading for the same data.
  GptDataset again(data, dir / "d", {0, 36}, seq, samples, 7);
  std::vector<int32_t> tokens_again(seq), targets_again(seq);
  for (int64_t i = 0; i < samples; ++i) {
    dataset.sample(i, tokens, targets);
    again.sample(i, tokens_again, targets_again);
    ASSERT_EQ(tokens, tokens_again);
  }
  GptDataset other_seed(data, dir / "d", {0, 36}, seq, samples, 8);
  int differences = 0;
  for (int64_t i = 0; i < samples; ++i) {
    dataset.sample(i, tokens, targets);
    other_seed.sample(i, tokens_again, targets_again);
    differences += tokens != tokens_again;
  }
  EXPECT_GT(differences, samples / 2);
}

TEST(GptDataset, StaleCachesAreRebuilt) {
  TempDir dir;
  write_documents(dir / "d", 20);
  auto count_cache_files = [&] {
    int files = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir / "d_kiln_cache")) ++files;
    return files;
  };
  GptDataset(std::make_shared<const IndexedDataset>(dir / "d", 10000), dir / "d", {0, 20}, 4, 30, 1);
  EXPECT_EQ(count_cache_files(), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_documents(dir / "d", 25);  // new data under the same name
  auto data = std::make_shared<const IndexedDataset>(dir / "d", 10000);
  GptDataset rebuilt(data, dir / "d", {0, 25}, 4, 30, 1);
  EXPECT_EQ(count_cache_files(), 4);
  std::vector<int32_t> tokens(4), targets(4);
  std::set<int32_t> documents;
  for (int64_t i = 0; i < 30; ++i) {
    rebuilt.sample(i, tokens, targets);
    for (int32_t token : tokens) documents.insert(token / 100);
  }
  EXPECT_GT(*documents.rbegin(), 19);  // the new documents are read
}

TEST(GptDataset, BatchReadsEqualSampleBySampleReads) {
  TempDir dir;
  write_documents(dir / "a", 30, 0);
  write_documents(dir / "b", 30, 5000);
  StorageOptions pread_options;
  pread_options.local_io = LocalIo::Pread;
  const Storage pread(pread_options);
  const std::vector<int64_t> indices = {5, 0, 399, 17, 17, 250, 3};  // repeats, any order, past the end
  for (const std::string& path : {dir / "a", "0.25 " + (dir / "a") + " 0.75 " + (dir / "b")}) {
    for (const Storage* storage : {&Storage::defaults(), &pread}) {
      auto source = make_gpt_data(path, "1,0,0", DataSplit::Train, 10000, 6, 300, 3, *storage);
      std::vector<int32_t> batch_tokens(indices.size() * 6), batch_targets(batch_tokens.size());
      source->samples(indices, batch_tokens, batch_targets);
      std::vector<int32_t> tokens(6), targets(6);
      for (size_t row = 0; row < indices.size(); ++row) {
        source->sample(indices[row], tokens, targets);
        EXPECT_EQ(std::vector<int32_t>(batch_tokens.begin() + static_cast<std::ptrdiff_t>(row * 6),
                                       batch_tokens.begin() + static_cast<std::ptrdiff_t>(row * 6 + 6)),
                  tokens) << path << " row " << row;
        EXPECT_EQ(std::vector<int32_t>(batch_targets.begin() + static_cast<std::ptrdiff_t>(row * 6),
                                       batch_targets.begin() + static_cast<std::ptrdiff_t>(row * 6 + 6)),
                  targets) << path << " row " << row;
      }
      EXPECT_NE(error_of([&] { source->samples(indices, tokens, targets); }).find("7 samples of 6 tokens need 42"),
                std::string::npos);
    }
  }
}

TEST(GptDataset, BlendFollowsTheWeights) {
  TempDir dir;
  write_documents(dir / "a", 30, 0);
  write_documents(dir / "b", 30, 5000);
  const std::string path = "0.25 " + (dir / "a") + " 0.75 " + (dir / "b");
  ASSERT_TRUE(is_indexed_data_path(path));
  auto blended = make_gpt_data(path, "1,0,0", DataSplit::Train, 10000, 4, 400, 3);
  std::vector<int32_t> tokens(4), targets(4);
  int from_b = 0;
  for (int64_t i = 0; i < 400; ++i) {
    blended->sample(i, tokens, targets);
    from_b += tokens[0] >= 5000;
  }
  EXPECT_EQ(from_b, 300);
  EXPECT_NE(error_of([&] { parse_data_path("0.3 " + (dir / "a") + " " + (dir / "b")); }).find("weight/prefix pairs"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_data_path("x " + (dir / "a")); }).find("weight 'x'"), std::string::npos);
}

// kWholeSplit: one epoch's windows, each once. Their inputs tile the shuffled documents' stream
// from its start, so they hold every token of the split exactly once but the last partial window's
// (document tokens are all different, write_documents).
TEST(GptDataset, AWholeSplitIsEveryWindowOfOneEpochOnce) {
  TempDir dir;
  write_documents(dir / "d", 40);
  auto data = std::make_shared<const IndexedDataset>(dir / "d", 10000);
  const int64_t seq = 6;
  GptDataset whole(data, dir / "d", {30, 40}, seq, GptDataset::kWholeSplit, 7);
  std::set<int32_t> split_tokens;
  for (int d = 30; d < 40; ++d)
    for (int t = 0; t < 5 + d % 7; ++t) split_tokens.insert(100 * d + t);
  const auto tokens_in_split = static_cast<int64_t>(split_tokens.size());
  ASSERT_EQ(whole.num_tokens(), tokens_in_split);
  ASSERT_TRUE(whole.distinct_samples().has_value());
  const int64_t n = *whole.distinct_samples();
  EXPECT_EQ(n, (tokens_in_split - 1) / seq);
  std::vector<int32_t> tokens(seq), targets(seq);
  std::multiset<int32_t> read;
  for (int64_t i = 0; i < n; ++i) {
    whole.sample(i, tokens, targets);
    read.insert(tokens.begin(), tokens.end());
  }
  EXPECT_EQ(static_cast<int64_t>(read.size()), n * seq);
  EXPECT_EQ(std::set<int32_t>(read.begin(), read.end()).size(), read.size()) << "a window read twice";
  for (const int32_t token : read) EXPECT_TRUE(split_tokens.count(token)) << token << " is not the split's";
  EXPECT_LE(tokens_in_split - n * seq, seq) << "only the last partial window is left out";
  // Any other count: drawn without end. A blend has no whole split to read.
  EXPECT_FALSE(GptDataset(data, dir / "d", {30, 40}, seq, n, 7).distinct_samples().has_value());
  write_documents(dir / "e", 20, 5000);
  EXPECT_NE(error_of([&] {
              make_gpt_data("0.5 " + (dir / "d") + " 0.5 " + (dir / "e"), "1,1,0", DataSplit::Validation, 10000, seq,
                            GptDataset::kWholeSplit, 7);
            }).find("config key 'eval_whole_split' is set, but data_path '0.5 "),
            std::string::npos);
}

// --eval-whole-split over an indexed dataset: the mean loss over every window of the split, as the
// model gives it window by window, whatever the padding of the last micro-batch; over two ranks,
// the same bits as one.
TEST(GptDataset, WholeSplitValidationIsTheMeanOverEveryWindow) {
  TempDir dir;
  write_documents(dir / "d", 200);
  Config config;
  config.data_path = dir / "d";
  config.split = "80,20,0";
  config.vocab_size = 20000;
  config.num_layers = 1;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.seq_length = 8;
  config.micro_batch_size = 4;
  config.global_batch_size = 8;  // 2 micro-batches: one a rank over two
  config.eval_iters = 1;
  config.eval_whole_split = true;
  const auto source = make_gpt_data(config.data_path, config.split, DataSplit::Validation, config.vocab_size,
                                    config.seq_length, GptDataset::kWholeSplit, static_cast<uint64_t>(config.seed));
  const int64_t n = *source->distinct_samples();
  ASSERT_NE(n % config.micro_batch_size, 0) << "the last micro-batch is to be padded";
  Config one_by_one = config;
  one_by_one.micro_batch_size = 1;  // accumulation 8: the same model, from the same seed
  Trainer single(one_by_one);
  // The trainer's parameters in a model of their own, window by window.
  const auto backend = make_backend("cpu");
  Gpt model(single.config().gpt(), *backend);
  const Tensor params = single.model().params();
  model.set_parameters({params.as<float>(), static_cast<size_t>(params.numel())});
  const int64_t seq = config.seq_length;
  model.allocate_activations(1, seq, {}, seq);
  std::vector<int32_t> tokens(static_cast<size_t>(seq)), targets(tokens.size());
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    source->sample(i, tokens, targets);
    sum += model.forward(MicroBatch{tokens, targets, 1, seq});
  }
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(single.evaluate().lm_loss, mean, 1e-9 * mean);
  const std::string description = open_training_data(config, ModelInput::NextTokens).description;
  EXPECT_NE(description.find("validation: the split's " + std::to_string(n) + " samples of 8 tokens"),
            std::string::npos)
      << description;
  Trainer trainer(config);
  const double padded = trainer.evaluate().lm_loss;
  EXPECT_NEAR(padded, mean, 1e-6 * mean);
  std::vector<double> ranks(2);
  testing::on_gloo_ranks(2, [&](GlooCommunicator& communicator) {
    Trainer rank(config, &communicator);
    ranks[static_cast<size_t>(communicator.rank())] = rank.evaluate().lm_loss;
  });
  EXPECT_EQ(ranks[0], padded);
  EXPECT_EQ(ranks[1], padded);
}

TEST(GptDataset, TrainerTrainsOnIndexedDataReproducibly) {
  TempDir dir;
  write_documents(dir / "d", 200);
  auto losses = [&](const std::string& split) {
    Config config;
    config.data_path = dir / "d";
    config.split = split;
    config.vocab_size = 20000;
    config.num_layers = 1;
    config.hidden_size = 16;
    config.num_attention_heads = 2;
    config.seq_length = 8;
    config.micro_batch_size = 2;
    config.train_iters = 4;
    config.eval_iters = 1;
    Trainer trainer(config);
    struct : TrainObserver {
      void on_iteration(const IterationStats& stats) override { values.push_back(stats.lm_loss); }
      std::vector<double> values;
    } recorder;
    trainer.add_observer(&recorder);
    trainer.run();
    return recorder.values;
  };
  EXPECT_EQ(losses("90,10,0"), losses("90,10,0"));
  EXPECT_NE(error_of([&] { losses("1,0,0"); }).find("the split holds no documents"), std::string::npos);
}

}  // namespace
}  // namespace kiln
