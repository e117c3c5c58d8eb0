// kiln lab's defaults (lab/lab_defaults.h): the seed lab's classifier at its own shape on CUDA and
// scaled down on the CPU; the synthetic text whose labels come from its cue words, whose every
// row fits its sequence whole once tokenized, and which the text-classification reader opens.
#include "kiln/lab/lab_defaults.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/data/text_classification.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::TempDir;

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

int64_t words_in(const std::string& text) { return std::count(text.begin(), text.end(), ' ') + 1; }

TEST(LabDefaults, TheClassifierIsTheLabsShapeOnCudaAndScaledDownOnTheCpu) {
  const Config gpu = lab_classifier_base(true);
  EXPECT_EQ(gpu.model, "encoder-classifier");
  EXPECT_EQ(gpu.device, "cuda");
  EXPECT_EQ(gpu.num_layers, 18);
  EXPECT_EQ(gpu.hidden_size, 1280);
  EXPECT_EQ(gpu.num_attention_heads, 20);
  EXPECT_EQ(gpu.seq_length, 512);
  EXPECT_EQ(gpu.micro_batch_size, 5);
  const Config cpu = lab_classifier_base(false);
  EXPECT_EQ(cpu.model, "encoder-classifier");
  EXPECT_EQ(cpu.device, "cpu");
  EXPECT_LT(cpu.num_layers * cpu.hidden_size * cpu.hidden_size,
            gpu.num_layers * gpu.hidden_size * gpu.hidden_size);
  // The lab's proportions: 64 per head (the FFN is 4 x hidden in every kiln encoder).
  EXPECT_EQ(cpu.hidden_size / cpu.num_attention_heads, gpu.hidden_size / gpu.num_attention_heads);
  for (const Config& config : {gpu, cpu}) {
    EXPECT_EQ(config.num_intermediate_layers, 2);
    EXPECT_EQ(config.num_labels, 2);
    EXPECT_EQ(config.vocab_size, 0);  // the data's
  }
}

TEST(LabDefaults, ATextsLabelIsTheLabelMostOfItsCueWordsBelongTo) {
  // With two labels the even cue words (terrible, awful, ...) are label 0, the odd ones label 1.
  EXPECT_EQ(synthetic_text_label("the day was terrible", 2), 0);
  EXPECT_EQ(synthetic_text_label("wonderful and happy but awful", 2), 1);
  EXPECT_EQ(synthetic_text_label("terrible wonderful", 2), 0);   // a tie: the lowest
  EXPECT_EQ(synthetic_text_label("the river in winter", 2), 0);  // no cue
  EXPECT_EQ(synthetic_text_label("awful", 3), 2);  // cue word 2 of a three-label lexicon
  EXPECT_EQ(synthetic_text_label("", 2), 0);
}

TEST(LabDefaults, SyntheticTextHasLabelsFromItsWordsAndFitsItsSequenceWhole) {
  const TempDir dir;
  SyntheticTextOptions options;
  options.rows = 400;
  options.seq_length = 32;
  write_synthetic_text(dir / "train.jsonl", options);
  const std::vector<nlohmann::json> lines = read_lines(dir / "train.jsonl");
  ASSERT_EQ(lines.size(), 400u);
  const Gpt2Tokenizer tokenizer(default_gpt2_tokenizer_dir());
  int64_t ones = 0;
  for (const nlohmann::json& line : lines) {
    const std::string text = line.at("text").get<std::string>();
    const int64_t label = line.at("label").get<int64_t>();
    EXPECT_EQ(label, synthetic_text_label(text, 2)) << text;
    EXPECT_GE(words_in(text), 8) << text;
    EXPECT_LE(words_in(text), 16) << text;
    EXPECT_LE(static_cast<int64_t>(tokenizer.encode(text).size()), 32)
        << text;  // the model sees every cue
    ones += label;
  }
  // Both labels, neither rare: something to learn beyond the majority.
  EXPECT_GT(ones, 120);
  EXPECT_LT(ones, 280);

  // What the loader's workers read: the same rows, tokenized and padded.
  const TextClassificationDataset dataset(dir / "train.jsonl", tokenizer, {"text", "label", 32, 2});
  ASSERT_EQ(dataset.size(), 400);
  const ClassificationSample sample = dataset.sample(0);
  EXPECT_EQ(sample.label, lines[0].at("label").get<int32_t>());
  EXPECT_EQ(sample.attention_mask.back(), 0);  // the text ends before the sequence does
}

TEST(LabDefaults, SyntheticTextUsesTheGivenKeysAndEveryLabel) {
  const TempDir dir;
  SyntheticTextOptions options;
  options.rows = 300;
  options.num_labels = 3;
  options.text_key = "body";
  options.label_key = "class";
  write_synthetic_text(dir / "train.jsonl", options);
  std::vector<int64_t> counts(3, 0);
  for (const nlohmann::json& line : read_lines(dir / "train.jsonl"))
    ++counts.at(static_cast<size_t>(line.at("class").get<int64_t>()));
  for (const int64_t count : counts) EXPECT_GT(count, 50);
  // Deterministic in the seed.
  const TempDir again;
  write_synthetic_text(again / "train.jsonl", options);
  EXPECT_EQ(testing::read_file_bytes(dir / "train.jsonl"),
            testing::read_file_bytes(again / "train.jsonl"));
}

}  // namespace
}  // namespace kiln
