// `kiln lab` as a user runs it, on a small configuration on the CPU: labs 1 and 2 finish and their
// JSON has every row, measured or with its reason; lab 6 runs 2 and 4 ranks as processes over
// Gloo and lab 5 combines the fastest rows; --report writes the HTML page; bad flags are named.
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
testing::CommandResult run_kiln_into(const std::string& arguments, const std::string& path) {
  return testing::run_command("(" + testing::kiln_binary() + " " + arguments + " > " + path + ")");
}

const std::string kSmall =
    "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 --vocab-size 64 "
    "--warmup-iters 1 --timed-iters 2";

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
      if (row["baseline"].get<bool>()) EXPECT_EQ(row["ratio"].get<double>(), 1.0);
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
}

}  // namespace
}  // namespace kiln
