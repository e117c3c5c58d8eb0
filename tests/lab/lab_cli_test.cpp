// `kiln lab` as a user runs it, on small configurations on the CPU: without a named model the base
// is the seed lab's classifier, on synthetic text; labs 1 and 2 finish for GPT and for the
// classifier and their JSON has every row, measured or with its reason; lab 6 runs 2 and 4 ranks
// as processes over Gloo and lab 5 combines the fastest rows; --report writes the HTML page; bad
// flags are named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::run_kiln;
using testing::TempDir;

// kiln with `arguments`, its stdout into `path`; the result's output is then its stderr alone.
// `environment` ("NAME=value ...") goes before the command.
testing::CommandResult run_kiln_into(const std::string& arguments, const std::string& path,
                                     const std::string& environment = "") {
  return testing::run_command("(" + environment + " " + testing::kiln_binary() + " " + arguments + " > " + path + ")");
}

const std::string kShape =
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 --warmup-iters 1 "
    "--timed-iters 2";
const std::string kSmall = "--model gpt --vocab-size 64 " + kShape;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

void expect_every_row_measured_or_explained(const nlohmann::json& lab) {
  for (const nlohmann::json& row : lab["rows"]) {
    if (row["ran"].get<bool>()) {
      EXPECT_GT(row["samples_per_second"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["step_ms"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["peak_memory_bytes"].get<int64_t>(), 0) << row.dump();
      EXPECT_GE(row["data_wait_share"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["ratio"].get<double>(), 0) << row.dump();
      if (row["baseline"].get<bool>()) {
        EXPECT_EQ(row["ratio"].get<double>(), 1.0);
      }
    } else {
      EXPECT_FALSE(row["unavailable"].get<std::string>().empty()) << row.dump();
    }
  }
}

TEST(LabCli, LabsOneAndTwoOnASmallConfigFinishWithEveryRowInTheJson) {
  const TempDir dir;
  const testing::CommandResult result = run_kiln_into("lab --labs 1,2 --json " + kSmall, dir / "lab.json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("kiln lab: lab 2 (Gradient tricks): micro-batch 1 x accumulation 4, recompute full"),
            std::string::npos)
      << result.output;  // progress on stderr
  const nlohmann::json json = read_json(dir / "lab.json");
  EXPECT_NE(json["machine"].get<std::string>().find("cpu"), std::string::npos);
  EXPECT_EQ(json["model"].get<std::string>().rfind("GPT: 1 layers, hidden 32", 0), 0u) << json["model"];
  ASSERT_EQ(json["labs"].size(), 2u);
  const nlohmann::json& loading = json["labs"][0];
  EXPECT_EQ(loading["lab"], 1);
  ASSERT_EQ(loading["rows"].size(), 12u);
  int ran = 0;
  for (const nlohmann::json& row : loading["rows"]) ran += row["ran"].get<bool>();
  EXPECT_EQ(ran, 7);  // the pinned and copy-stream rows are the GPU's
  expect_every_row_measured_or_explained(loading);
  const nlohmann::json& tricks = json["labs"][1];
  ASSERT_EQ(tricks["rows"].size(), 9u);
  for (const nlohmann::json& row : tricks["rows"]) EXPECT_TRUE(row["ran"].get<bool>()) << row.dump();
  expect_every_row_measured_or_explained(tricks);
  // Accumulation holds a quarter of the micro-batch's activations at once.
  EXPECT_LT(tricks["rows"][6]["peak_memory_bytes"].get<int64_t>(), tricks["rows"][0]["peak_memory_bytes"].get<int64_t>());
}

TEST(LabCli, TheClassifiersLabsOneAndTwoOnSyntheticTextHaveEveryRowTheRecomputationOnesWithTheirReason) {
  const TempDir dir;
  // One OpenMP thread, as the docs' runnable blocks have: beside other tests on two cores, two
  // threads wait for each other at every op, and the classifier's steps are many small ops.
  const testing::CommandResult result =
      run_kiln_into("lab --labs 1,2 --json " + kShape, dir / "lab.json", "OMP_NUM_THREADS=1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = read_json(dir / "lab.json");
  const std::string model = json["model"].get<std::string>();
  EXPECT_EQ(model.rfind("encoder classifier: 1 layers, hidden 32, 2 heads, 2 intermediate layers, 2 labels, "
                        "vocabulary 50257", 0),
            0u)
      << model;
  EXPECT_NE(model.find("synthetic text"), std::string::npos) << model;
  const nlohmann::json& loading = json["labs"][0];
  ASSERT_EQ(loading["rows"].size(), 12u);
  int ran = 0;
  for (const nlohmann::json& row : loading["rows"]) ran += row["ran"].get<bool>();
  EXPECT_EQ(ran, 7);  // the pinned and copy-stream rows are the GPU's
  expect_every_row_measured_or_explained(loading);
  const nlohmann::json& tricks = json["labs"][1];
  ASSERT_EQ(tricks["rows"].size(), 9u);
  for (const nlohmann::json& row : tricks["rows"])  // recomputation too: the classifier's blocks recompute
    EXPECT_TRUE(row["ran"].get<bool>()) << row.dump();
  expect_every_row_measured_or_explained(tricks);
}

// Lab 4 with --mock-data reads nothing, so these runs plan and stop: enough to see the base.
TEST(LabCli, TheDefaultBaseIsTheClassifierUnlessTheFlagsOrAConfigFileNameTheModel) {
  const TempDir dir;
  const std::string fast = "lab --labs 4 --json --mock-data --vocab-size 64";
  const auto model_of = [&](const std::string& arguments) {
    const testing::CommandResult result = run_kiln_into(fast + " " + arguments, dir / "lab.json");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json json = read_json(dir / "lab.json");
    return json["machine"].get<std::string>() + " | " + json["model"].get<std::string>();
  };
  const std::string scaled = model_of("");
  EXPECT_NE(scaled.find(scaled.rfind("cpu", 0) == 0 ? "| encoder classifier: 2 layers, hidden 128, 2 heads"
                                                      : "| encoder classifier: 18 layers, hidden 1280, 20 heads"),
            std::string::npos)
      << scaled;
  EXPECT_NE(model_of("--device cpu --num-layers 3 --seq-length 64").find("encoder classifier: 3 layers, hidden 128"),
            std::string::npos);
  EXPECT_NE(model_of("--model gpt").find("| GPT: 4 layers, hidden 128"), std::string::npos);
  // A configuration file is read as kiln train reads it: no model key is GPT.
  testing::write_file_bytes(dir / "small.yaml", "num_layers: 2\n");
  EXPECT_NE(model_of("--config " + (dir / "small.yaml")).find("| GPT: 2 layers"), std::string::npos);
}

TEST(LabCli, RanksRunAsProcessesAllTogetherCombinesAndTheReportIsWritten) {
  const TempDir dir;
  const testing::CommandResult result =
      run_kiln_into("lab --labs 3,5,6 --json --report " + (dir / "lab.html") + " " + kSmall, dir / "lab.json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = read_json(dir / "lab.json");
  ASSERT_EQ(json["labs"].size(), 3u);
  const nlohmann::json& together = json["labs"][1];
  EXPECT_EQ(together["lab"], 5);
  ASSERT_EQ(together["rows"].size(), 2u);
  EXPECT_EQ(together["rows"][1]["name"].get<std::string>().rfind("lab 3: ", 0), 0u) << together.dump();
  const nlohmann::json& ranks = json["labs"][2];
  ASSERT_EQ(ranks["rows"].size(), 3u);
  for (const nlohmann::json& row : ranks["rows"]) EXPECT_TRUE(row["ran"].get<bool>()) << row.dump();
  EXPECT_EQ(ranks["rows"][2]["ranks"], 4);
  expect_every_row_measured_or_explained(ranks);
  std::ifstream page(dir / "lab.html");
  std::stringstream html;
  html << page.rdbuf();
  EXPECT_NE(html.str().find("<svg"), std::string::npos);
  EXPECT_NE(html.str().find("Data-parallel ranks"), std::string::npos);
}

TEST(LabCli, BadFlagsAreNamed) {
  testing::CommandResult result = run_kiln("lab --labs 7 " + kSmall);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("lab 7 does not exist"), std::string::npos) << result.output;
  result = run_kiln("lab --labs 2 --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "
                    "--timed-iters 0");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("--timed-iters positive"), std::string::npos) << result.output;
  // The classifier's synthetic text is GPT-2 tokens: a smaller vocabulary could not embed them.
  result = run_kiln("lab --labs 2 --vocab-size 64 " + kShape);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("vocabulary of 50257 (its tokenizer's), more than --vocab-size 64"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace kiln
