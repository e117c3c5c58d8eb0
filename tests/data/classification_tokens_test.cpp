// Classification samples as a TokenSource (data/classification_tokens.h): the packing and its
// inverse, every epoch visiting every row in its own seeded order, a pure function of the index,
// a row that starts with padding named, and the loader's workers tokenizing text into the very
// batches the calling thread makes.
#include "kiln/data/classification_tokens.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "kiln/data/loader.h"
#include "kiln/data/text_classification.h"
#include "kiln/nn/encoder_classifier.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;

constexpr int64_t kSeq = 4;

// Row r: ids r*10 + t, its first r % 3 + 1 positions real, label r % 2.
ClassificationSample synthetic_row(int64_t row) {
  ClassificationSample sample;
  for (int64_t t = 0; t < kSeq; ++t) {
    const bool real = t <= row % 3;
    sample.input_ids.push_back(real ? static_cast<int32_t>(row * 10 + t) : 0);
    sample.attention_mask.push_back(real ? 1 : 0);
  }
  sample.label = static_cast<int32_t>(row % 2);
  return sample;
}

TEST(ClassificationTokens, PacksTheLabelIntoTheFirstMaskSlotAndUnpacksIt) {
  const ClassificationTokens source(synthetic_row, 5, kSeq, 7, "synthetic");
  std::vector<int32_t> tokens(2 * kSeq), targets(2 * kSeq);
  source.sample(0, std::span(tokens).first(kSeq), std::span(targets).first(kSeq));
  source.sample(1, std::span(tokens).subspan(kSeq), std::span(targets).subspan(kSeq));
  const UnpackedClassification unpacked = unpack_classification(tokens, targets, 2, kSeq);
  for (int64_t b = 0; b < 2; ++b) {
    const ClassificationSample expected = synthetic_row(source.row_of(b));
    const auto at = static_cast<size_t>(b * kSeq);
    EXPECT_EQ(std::vector<int32_t>(unpacked.input_ids.begin() + at, unpacked.input_ids.begin() + at + kSeq),
              expected.input_ids);
    EXPECT_EQ(std::vector<int32_t>(unpacked.attention_mask.begin() + at, unpacked.attention_mask.begin() + at + kSeq),
              expected.attention_mask);
    EXPECT_EQ(unpacked.labels[static_cast<size_t>(b)], expected.label);
    EXPECT_EQ(targets[at], expected.label);
  }
}

// Whole-split validation's padding: the label's slot no longer counts, the mask beside it stays;
// the first `distinct_samples` samples are the rows, once each (the test below).
TEST(ClassificationTokens, AnUncountedSampleKeepsItsMaskAndLosesItsLabel) {
  const ClassificationTokens source(synthetic_row, 5, kSeq, 7, "synthetic");
  EXPECT_EQ(source.distinct_samples(), 5);
  std::vector<int32_t> tokens(kSeq), targets(kSeq);
  source.sample(2, tokens, targets);
  const std::vector<int32_t> before = targets;
  source.mark_uncounted(targets);
  EXPECT_EQ(targets[0], kUncountedTarget);
  EXPECT_TRUE(std::equal(targets.begin() + 1, targets.end(), before.begin() + 1));
  EXPECT_EQ(unpack_classification(tokens, targets, 1, kSeq).labels, std::vector<int32_t>{kUncountedTarget});
  // A source of next-token targets marks every target; its samples have no end.
  const MockTokens windows(50, kSeq, 1);
  EXPECT_FALSE(windows.distinct_samples().has_value());
  windows.mark_uncounted(targets);
  EXPECT_EQ(targets, std::vector<int32_t>(kSeq, kUncountedTarget));
}

TEST(ClassificationTokens, EveryEpochVisitsEveryRowInItsOwnOrder) {
  const int64_t rows = 12;
  const ClassificationTokens source(synthetic_row, rows, kSeq, 3, "synthetic");
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t j = 0; j < rows; ++j) epochs[static_cast<size_t>(e)].push_back(source.row_of(e * rows + j));
  for (const std::vector<int64_t>& epoch : epochs)
    EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(), static_cast<size_t>(rows));
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  // A pure function of (seed, index): another source with the seed agrees, another seed does not.
  const ClassificationTokens again(synthetic_row, rows, kSeq, 3, "synthetic");
  const ClassificationTokens other(synthetic_row, rows, kSeq, 4, "synthetic");
  std::vector<int64_t> same, different;
  for (int64_t i = 0; i < 3 * rows; ++i) {
    same.push_back(again.row_of(i));
    different.push_back(other.row_of(i));
  }
  std::vector<int64_t> all;
  for (const auto& epoch : epochs) all.insert(all.end(), epoch.begin(), epoch.end());
  EXPECT_EQ(same, all);
  EXPECT_NE(different, all);
}

TEST(ClassificationTokens, ARowThatStartsWithPaddingIsNamed) {
  const auto padded_first = [](int64_t row) {
    ClassificationSample sample = synthetic_row(row);
    sample.attention_mask[0] = 0;
    return sample;
  };
  const ClassificationTokens source(padded_first, 2, kSeq, 1, "spam.csv");
  std::vector<int32_t> tokens(kSeq), targets(kSeq);
  const std::string message = error_of([&] { source.sample(0, tokens, targets); });
  EXPECT_NE(message.find("spam.csv: row "), std::string::npos) << message;
  EXPECT_NE(message.find("starts with padding"), std::string::npos) << message;
}

// The loader's workers run the tokenizer: their batches are the calling thread's, bit for bit.
TEST(ClassificationTokens, LoaderWorkersTokenizeTextIntoTheSameBatches) {
  const testing::TempDir dir;
  {
    std::ofstream file(dir / "train.jsonl");
    for (int i = 0; i < 40; ++i)
      file << "{\"text\": \"message " << i << (i % 3 ? " about the meeting tomorrow" : " WIN A PRIZE now!!!")
           << "\", \"label\": " << (i % 3 ? 0 : 1) << "}\n";
  }
  static const Gpt2Tokenizer tokenizer(KILN_DEFAULT_TOKENIZER_DIR);
  const TextClassificationDataset text(dir / "train.jsonl", tokenizer, {"text", "label", 8, 2});
  const ClassificationTokens source([&](int64_t row) { return text.sample(row); }, text.size(), 8, 5, "train.jsonl");
  const auto batches = [&](int workers) {
    DataLoader loader(source, 4, {workers, 2, 0});
    std::vector<int32_t> all, tokens, targets;
    for (int64_t first = 0; first < 80; first += 4) {  // two epochs
      loader.next(first, tokens, targets);
      all.insert(all.end(), tokens.begin(), tokens.end());
      all.insert(all.end(), targets.begin(), targets.end());
    }
    return all;
  };
  const std::vector<int32_t> alone = batches(0);
  EXPECT_EQ(batches(2), alone);
  EXPECT_EQ(batches(3), alone);
}

}  // namespace
}  // namespace kiln
