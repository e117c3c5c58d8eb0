// Sequence-classification CSV: synthetic sets, the row index, and malformed rows.
#include "kiln/data/classification_csv.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

ClassificationSynthOptions small_set(const std::string& dir) {
  ClassificationSynthOptions options;
  options.output_dir = dir;
  options.files = 4;
  options.min_rows = 100;
  options.max_rows = 300;
  options.seq_length = 16;
  options.vocab_size = 1000;
  options.num_labels = 3;
  options.seed = 5;
  return options;
}

TEST(ClassificationCsv, SynthesisedSetsReadBackThroughTheRowIndex) {
  TempDir dir;
  const int64_t rows = write_synthetic_classification(small_set(dir.path()));
  const ClassificationDataset dataset(dir.path());
  ASSERT_EQ(dataset.size(), rows);
  EXPECT_GE(rows, 400);
  EXPECT_LE(rows, 1200);
  for (int64_t i = 0; i < dataset.size(); i += 37) {
    const ClassificationSample sample = dataset.sample(i);
    ASSERT_EQ(sample.input_ids.size(), 16u);
    EXPECT_EQ(sample.label, sample.input_ids[1] % 3);  // the learnable rule
    for (size_t t = 0; t < 16; ++t) EXPECT_EQ(sample.attention_mask[t] == 0, sample.input_ids[t] == 0);
  }
  // The last row of the last file is reachable and the same seed writes the same set.
  dataset.sample(dataset.size() - 1);
  TempDir again;
  write_synthetic_classification(small_set(again.path()));
  std::ifstream a(dir / "part-00002.csv"), b(again / "part-00002.csv");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
}

TEST(ClassificationCsv, MalformedRowsNameFileAndRow) {
  TempDir dir;
  std::ofstream(dir / "metadata.json")
      << nlohmann::json{{"files", {{{"name", "a.csv"}, {"rows", 6}}}}, {"seq_length", 3}, {"vocab_size", 50}, {"num_labels", 2}}.dump();
  std::ofstream(dir / "a.csv") << "input_ids,attention_mask,label\n"
                               << "\"1,2,3\",\"1,1,1\",1\n"     // row at line 2: fine
                               << "\"1,2\",\"1,1,1\",0\n"       // line 3: lengths disagree
                               << "\"1,x,3\",\"1,1,1\",0\n"     // line 4: not an integer
                               << "\"1,2,99\",\"1,1,1\",0\n"    // line 5: beyond the vocabulary
                               << "\"1,2,3\",\"1,1,1\"\n"       // line 6: missing label
                               << "\"1,2,3\",\"1,1,1\",7\n";    // line 7: label out of range
  const ClassificationDataset dataset(dir.path());
  EXPECT_EQ(dataset.sample(0).label, 1);
  const std::string file = dir / "a.csv";
  EXPECT_NE(error_of([&] { dataset.sample(1); }).find(file + ":3: 2 input_ids and 3 mask values"), std::string::npos);
  EXPECT_NE(error_of([&] { dataset.sample(2); }).find(file + ":4: field 'input_ids' has 'x', not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dataset.sample(3); }).find(file + ":5: input_ids[2] = 99 is outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dataset.sample(4); }).find(file + ":6: expected 3 fields"), std::string::npos);
  EXPECT_NE(error_of([&] { dataset.sample(5); }).find(file + ":7: label 7 is outside [0, 2)"), std::string::npos);
}

TEST(ClassificationCsv, RowCountsAreCheckedAgainstTheMetadata) {
  TempDir dir;
  write_synthetic_classification(small_set(dir.path()));
  std::ofstream(dir / "part-00001.csv") << "input_ids,attention_mask,label\n\"1,2\",\"1,1\",0\n";  // replaced, shorter
  EXPECT_NE(error_of([&] { ClassificationDataset dataset(dir.path()); }).find("part-00001.csv: 1 rows, but metadata.json says"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ClassificationDataset dataset(dir / "nothing"); }).find("metadata.json"), std::string::npos);
}

}  // namespace
}  // namespace kiln
