// `kiln classify` as a user runs it: a tiny classifier trained by `kiln train` on texts whose
// words come from one of two pools labels held-out texts, as a table and as JSON, the same
// whatever micro-batch a text lands in, and files without labels (no accuracy then); bad
// checkpoints and files (one mixing labelled and unlabelled rows) get one-line errors naming them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/rng.h"
#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::run_kiln;
using testing::TempDir;

constexpr const char* kPools[2][6] = {{"meeting", "agenda", "notes", "project", "review", "lunch"},
                                      {"prize", "winner", "cash", "offer", "free", "claim"}};

// "Subject:" then 4 to 9 words of one pool; the label is the pool. The first token is the same
// in every text, so the pooled first position must attend to the rest to tell them apart.
struct PoolText {
  std::string text;
  int label = 0;
};

std::vector<PoolText> pool_texts(int64_t rows, uint64_t seed) {
  Rng rng(seed);
  std::vector<PoolText> texts;
  for (int64_t row = 0; row < rows; ++row) {
    PoolText sample;
    sample.label = static_cast<int>(rng.below(2));
    sample.text = "Subject:";
    const uint64_t words = 4 + rng.below(6);
    for (uint64_t w = 0; w < words; ++w)
      sample.text += std::string(" ") + kPools[sample.label][rng.below(6)];
    texts.push_back(sample);
  }
  return texts;
}

void write_jsonl(const std::string& path, const std::vector<PoolText>& texts) {
  std::ofstream out(path);
  for (const PoolText& t : texts)
    out << nlohmann::json{{"text", t.text}, {"label", t.label}}.dump() << "\n";
}

void write_csv(const std::string& path, const std::vector<PoolText>& texts) {
  std::ofstream out(path);
  out << "label,text\n";
  for (const PoolText& t : texts) out << t.label << ",\"" << t.text << "\"\n";
}

// The texts alone: unlabelled data.
void write_unlabelled_jsonl(const std::string& path, const std::vector<PoolText>& texts) {
  std::ofstream out(path);
  for (const PoolText& t : texts) out << nlohmann::json{{"text", t.text}}.dump() << "\n";
}

void expect_error(const CommandResult& result, const std::string& fragment) {
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("kiln: error: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(fragment), std::string::npos) << result.output;
}

nlohmann::json parse_json(const CommandResult& result) {
  EXPECT_EQ(result.exit_code, 0) << result.output;
  try {
    return nlohmann::json::parse(result.output);
  } catch (const nlohmann::json::exception& error) {
    ADD_FAILURE() << "not JSON (" << error.what() << "):\n" << result.output;
    return {};
  }
}

// One classifier for the suite, trained once: 1 layer, hidden 32, 16 tokens, micro-batches
// of 8; 96 held-out texts in validation.jsonl.
class Classify : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    write_jsonl(*dir_ / "train.jsonl", pool_texts(512, 1));
    write_jsonl(*dir_ / "validation.jsonl", pool_texts(96, 2));
    const CommandResult trained =
        run_kiln("train --model encoder-classifier --data-path " + dir_->path() +
                 " --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                 "--num-intermediate-layers 1 --seq-length 16"
                 " --micro-batch-size 8 --global-batch-size 16 --train-iters 20 --lr 3e-3 "
                 "--lr-warmup-iters 2"
                 " --eval-iters 0 --num-workers 0 --save " +
                 (*dir_ / "ckpt"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::string load() { return " --load " + (*dir_ / "ckpt"); }

  static std::unique_ptr<TempDir> dir_;
};

std::unique_ptr<TempDir> Classify::dir_;

TEST_F(Classify, LabelsHeldOutTextsAndReportsTheAccuracy) {
  const CommandResult result =
      run_kiln("classify" + load() + " --data-path " + (*dir_ / "validation.jsonl") +
               " --samples 20 --text 'Subject: cash prize, claim it free'" +
               " --text 'Subject: lunch review\n\nagenda notes'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<PoolText> truth = pool_texts(96, 2);
  std::istringstream lines(result.output);
  std::string line;
  int rows = 0, correct = 0;
  std::vector<std::string> text_lines;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string word, index;
    fields >> word >> index;
    if (word == "--text") text_lines.push_back(line);
    if (word != "row") continue;
    ++rows;
    int predicted = -1, label = -1;
    double p0 = 0, p1 = 0;
    std::string right;
    fields >> predicted >> p0 >> p1 >> label >> right;
    EXPECT_EQ(std::stoi(index), rows) << line;
    EXPECT_EQ(label, truth[static_cast<size_t>(rows - 1)].label) << line;
    EXPECT_NEAR(p0 + p1, 1.0, 2e-4) << line;
    EXPECT_EQ(predicted, p1 > p0 ? 1 : 0) << line;
    EXPECT_EQ(right, predicted == label ? "yes" : "no") << line;
    correct += predicted == label;
    // The excerpt is the start of the text the model read, on one line.
    EXPECT_NE(line.find(truth[static_cast<size_t>(rows - 1)].text.substr(0, 20)), std::string::npos)
        << line;
  }
  EXPECT_EQ(rows, 20) << result.output;
  EXPECT_GE(correct, 18) << result.output;
  EXPECT_NE(result.output.find(
                fmt::format("accuracy: {:.4f} ({} of 20 labelled texts)", correct / 20.0, correct)),
            std::string::npos)
      << result.output;
  ASSERT_EQ(text_lines.size(), 2u) << result.output;
  EXPECT_NE(text_lines[0].find("--text 1          1 "), std::string::npos) << text_lines[0];
  EXPECT_NE(text_lines[1].find("--text 2          0 "), std::string::npos) << text_lines[1];
  EXPECT_NE(text_lines[1].find("   -      -  Subject: lunch review agenda notes"),
            std::string::npos)
      << "no true label, newlines collapsed: " << text_lines[1];
}

TEST_F(Classify, JsonParsesAndAgreesWithItself) {
  const nlohmann::json document = parse_json(
      run_kiln("classify" + load() + " --json --data-path " + (*dir_ / "validation.jsonl") +
               " --samples 11 --text 'Subject: free cash offer'"));
  ASSERT_TRUE(document.is_object());
  EXPECT_EQ(document["num_labels"], 2);
  EXPECT_NE(document["checkpoint"].get<std::string>().find("iter_0000020"), std::string::npos);
  const nlohmann::json& texts = document["texts"];
  ASSERT_EQ(texts.size(), 12u);
  int64_t correct = 0;
  for (const nlohmann::json& text : texts) {
    const std::vector<double> p = text["probabilities"];
    ASSERT_EQ(p.size(), 2u);
    EXPECT_NEAR(p[0] + p[1], 1.0, 1e-9);
    EXPECT_EQ(text["predicted"], p[1] > p[0] ? 1 : 0);
    if (!text["label"].is_null()) correct += text["label"] == text["predicted"];
  }
  EXPECT_EQ(texts[0]["source"], "row 1");
  EXPECT_EQ(texts[11]["source"], "--text 1");
  EXPECT_TRUE(texts[11]["label"].is_null());
  EXPECT_EQ(texts[11]["predicted"], 1);
  EXPECT_EQ(texts[11]["excerpt"], "Subject: free cash offer");
  EXPECT_EQ(document["labelled"], 11);
  EXPECT_EQ(document["correct"], correct);
  EXPECT_DOUBLE_EQ(document["accuracy"].get<double>(), static_cast<double>(correct) / 11.0);

  // The same texts from CSV, and one alone: the same probabilities whatever the micro-batch
  // (11 texts are one of 8 and one of 3).
  TempDir dir;
  const std::vector<PoolText> truth = pool_texts(11, 2);
  write_csv(dir / "validation.csv", truth);
  const nlohmann::json from_csv =
      parse_json(run_kiln("classify" + load() + " --json --data-path " + (dir / "validation.csv")));
  ASSERT_EQ(from_csv["texts"].size(), 11u);
  for (size_t i = 0; i < 11; ++i) {
    const std::vector<double> expected = texts[i]["probabilities"],
                              got = from_csv["texts"][i]["probabilities"];
    EXPECT_NEAR(got[1], expected[1], 1e-6) << i;
    EXPECT_EQ(from_csv["texts"][i]["label"], truth[i].label);
  }
  const nlohmann::json alone =
      parse_json(run_kiln("classify" + load() + " --json --text '" + truth[9].text + "'"));
  EXPECT_NEAR(alone["texts"][0]["probabilities"][1].get<double>(),
              texts[9]["probabilities"][1].get<double>(), 1e-6);
  EXPECT_TRUE(alone["accuracy"].is_null());
}

// Rows without labels get their predictions and probabilities, those of the same texts labelled,
// and no accuracy: "-" in the table's true and right columns and no accuracy line; in JSON null
// labels, 0 labelled and a null accuracy.
TEST_F(Classify, UnlabelledRowsGetPredictionsButNoAccuracy) {
  TempDir dir;
  const std::vector<PoolText> texts = pool_texts(11, 2);  // validation.jsonl's first 11
  write_unlabelled_jsonl(dir / "unlabelled.jsonl", texts);
  const nlohmann::json labelled =
      parse_json(run_kiln("classify" + load() + " --json --data-path " +
                          (*dir_ / "validation.jsonl") + " --samples 11"));
  const nlohmann::json unlabelled = parse_json(
      run_kiln("classify" + load() + " --json --data-path " + (dir / "unlabelled.jsonl")));
  ASSERT_EQ(unlabelled["texts"].size(), 11u);
  for (size_t i = 0; i < 11; ++i) {
    const nlohmann::json& text = unlabelled["texts"][i];
    EXPECT_EQ(text["source"], fmt::format("row {}", i + 1));
    EXPECT_TRUE(text["label"].is_null()) << i;
    EXPECT_EQ(text["predicted"], labelled["texts"][i]["predicted"]) << i;
    EXPECT_EQ(text["probabilities"], labelled["texts"][i]["probabilities"]) << i;
  }
  EXPECT_EQ(unlabelled["labelled"], 0);
  EXPECT_TRUE(unlabelled["accuracy"].is_null());

  std::ofstream(dir / "unlabelled.csv") << "text\n\"" << texts[0].text << "\"\n";
  const CommandResult table =
      run_kiln("classify" + load() + " --data-path " + (dir / "unlabelled.csv"));
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find(fmt::format("     row 1          {} ",
                                          labelled["texts"][0]["predicted"].get<int>())),
            std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("   -      -  " + texts[0].text.substr(0, 20)), std::string::npos)
      << table.output;
  EXPECT_EQ(table.output.find("accuracy"), std::string::npos) << table.output;
}

TEST(ClassifyErrors, BadInputIsNamed) {
  TempDir dir;
  write_jsonl(dir / "texts.jsonl", pool_texts(16, 3));
  const CommandResult trained =
      run_kiln("train --model encoder-classifier --data-path " + (dir / "texts.jsonl") +
               " --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
               "--micro-batch-size 2 --train-iters 1"
               " --eval-iters 0 --num-workers 0 --save " +
               (dir / "ckpt"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string load = " --load " + (dir / "ckpt");
  expect_error(run_kiln("classify --load " + (dir / "nowhere") + " --text hi"), "does not exist");
  expect_error(run_kiln("classify" + load), "nothing to classify");
  expect_error(run_kiln("classify" + load + " --data-path " + (dir / "missing.jsonl")),
               "missing.jsonl");
  std::ofstream(dir / "mixed.jsonl") << "{\"text\": \"Subject: prize\", \"label\": 1}\n"
                                     << "{\"text\": \"Subject: lunch\"}\n";
  expect_error(
      run_kiln("classify" + load + " --data-path " + (dir / "mixed.jsonl")),
      (dir / "mixed.jsonl") + " row 2 (line 2): has no label, but the file's first row has one");
  const CommandResult gpt = run_kiln(
      "train --mock-data --vocab-size 97 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 8"
      " --micro-batch-size 2 --train-iters 1 --eval-iters 0 --num-workers 0 --save " +
      (dir / "gpt"));
  ASSERT_EQ(gpt.exit_code, 0) << gpt.output;
  expect_error(run_kiln("classify --load " + (dir / "gpt") + " --text hi"),
               (dir / "gpt/iter_0000001") + ": a checkpoint of model 'gpt'");
  const CommandResult ids = run_kiln(
      "train --model encoder-classifier --mock-data --vocab-size 97 --num-layers 1 --hidden-size 16"
      " --num-attention-heads 2 --seq-length 8 --micro-batch-size 2 --train-iters 1 --eval-iters 0 "
      "--num-workers 0"
      " --save " +
      (dir / "ids"));
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  expect_error(run_kiln("classify --load " + (dir / "ids") + " --text hi"),
               "the model's vocabulary (97) is not GPT-2's");
}

}  // namespace
}  // namespace kiln
