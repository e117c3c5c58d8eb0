// kiln lab's plan (lab/lab_plan.h) and its table and JSON (lab/lab_result.h): the rows of each lab
// and the reasons rows cannot run on a machine or for a model, lab 5's combination of the fastest
// rows, settings applied by key.
#include "kiln/lab/lab_plan.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "support/error_of.h"

namespace kiln {
namespace {

using testing::error_of;

Config small_base() {
  Config config;
  config.num_layers = 1;
  config.hidden_size = 32;
  config.num_attention_heads = 2;
  config.seq_length = 16;
  config.micro_batch_size = 8;
  config.data_path = "/data/tokens";
  config.vocab_size = 64;
  return config;
}

const LabExperiment& lab_numbered(const std::vector<LabExperiment>& labs, int number) {
  for (const LabExperiment& lab : labs)
    if (lab.number == number) return lab;
  throw Error("no lab " + std::to_string(number));
}

std::vector<std::string> names(const LabExperiment& lab) {
  std::vector<std::string> out;
  for (const LabRowResult& row : lab.rows) out.push_back(row.name);
  return out;
}

TEST(LabPlan, EveryLabsRowsOnTheCpuWithTheReasonsSomeCannotRun) {
  const LabMachine cpu{false, 0, 2};
  const std::vector<LabExperiment> labs = plan_labs(small_base(), cpu, {});
  ASSERT_EQ(labs.size(), 6u);

  const LabExperiment& loading = lab_numbered(labs, 1);
  ASSERT_EQ(loading.rows.size(), 12u);
  EXPECT_EQ(loading.rows[0].name, "workers 0, pinned off");
  EXPECT_TRUE(loading.rows[0].baseline);
  for (const LabRowResult& row : loading.rows) {
    const bool gpu_only = row.name.find("pinned on") != std::string::npos || row.name.find("copy") != std::string::npos;
    EXPECT_EQ(row.unavailable.empty(), !gpu_only) << row.name << ": " << row.unavailable;
    if (gpu_only) {
      EXPECT_NE(row.unavailable.find("runs on the CPU"), std::string::npos) << row.unavailable;
    }
  }

  const LabExperiment& tricks = lab_numbered(labs, 2);
  ASSERT_EQ(tricks.rows.size(), 9u);
  EXPECT_EQ(tricks.rows[0].name, "micro-batch 8 x accumulation 1, recompute none");
  EXPECT_EQ(tricks.rows[8].name, "micro-batch 2 x accumulation 4, recompute full");
  for (const LabRowResult& row : tricks.rows) {
    EXPECT_TRUE(row.unavailable.empty()) << row.name;
    // The same global batch on every row: only how it is cut changes.
    const Config config = with_settings(small_base(), row);
    EXPECT_EQ(config.global_batch_size, 8) << row.name;
  }

  const LabExperiment& precision = lab_numbered(labs, 3);
  EXPECT_EQ(names(precision),
            (std::vector<std::string>{"fp32", "tf32", "fp16 with loss scaling", "bf16", "fp8 (hybrid) on bf16"}));
  EXPECT_FALSE(precision.rows[1].unavailable.empty());  // TF32 is a tensor-core mode
  const Config fp8 = with_settings(small_base(), precision.rows[4]);
  EXPECT_TRUE(fp8.bf16);
  EXPECT_EQ(fp8.fp8_format, "hybrid");

  const LabExperiment& storage = lab_numbered(labs, 4);
  ASSERT_EQ(storage.rows.size(), 4u);
  EXPECT_TRUE(storage.rows[0].unavailable.empty());
  EXPECT_TRUE(storage.rows[1].unavailable.empty());
  EXPECT_NE(storage.rows[2].unavailable.find("--s3-data-path"), std::string::npos) << storage.rows[2].unavailable;

  const LabExperiment& ranks = lab_numbered(labs, 6);
  EXPECT_EQ(names(ranks), (std::vector<std::string>{"1 rank", "2 ranks", "4 ranks"}));
  EXPECT_EQ(ranks.rows[2].ranks, 4);
  const Config four = with_settings(small_base(), ranks.rows[2]);
  EXPECT_EQ(four.micro_batch_size, 2);  // 8 samples over 4 ranks
  EXPECT_EQ(four.global_batch_size, 8);
}

TEST(LabPlan, WhatCannotRunSaysWhy) {
  Config mock = small_base();
  mock.mock_data = true;
  const std::vector<LabExperiment> labs = plan_labs(mock, LabMachine{true, 1, 16}, {{4, 6}, "", ""});
  ASSERT_EQ(labs.size(), 2u);
  EXPECT_NE(labs[0].unavailable.find("--mock-data"), std::string::npos) << labs[0].unavailable;
  EXPECT_TRUE(labs[0].rows.empty());
  // One GPU: the ranks' rows need more; on a GPU the pinned and copy-stream rows do run.
  EXPECT_TRUE(labs[1].rows[0].unavailable.empty());
  EXPECT_EQ(labs[1].rows[1].unavailable, "2 ranks need 2 GPUs; this machine has 1");
  const std::vector<LabExperiment> gpu = plan_labs(small_base(), LabMachine{true, 1, 16}, {{1}, "", ""});
  for (const LabRowResult& row : gpu[0].rows) EXPECT_TRUE(row.unavailable.empty()) << row.name;
  Config odd = small_base();
  odd.micro_batch_size = 3;
  const std::vector<LabExperiment> split = plan_labs(odd, LabMachine{false, 0, 2}, {{2, 6}, "", ""});
  EXPECT_NE(split[0].rows[3].unavailable.find("does not split into 2 micro-batches"), std::string::npos)
      << split[0].rows[3].unavailable;
  EXPECT_NE(split[1].rows[1].unavailable.find("does not split over 2 ranks"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_labs(small_base(), LabMachine{}, {{7}, "", ""}); }).find("lab 7 does not exist"),
            std::string::npos);
}

TEST(LabPlan, TheEncoderClassifiersRecomputationAndFp8RowsRunWithItsDropout) {
  Config classifier = small_base();
  classifier.model = "encoder-classifier";
  for (const LabMachine& machine : {LabMachine{false, 0, 2}, LabMachine{true, 1, 16}}) {
    const std::vector<LabExperiment> labs = plan_labs(classifier, machine, {{2, 3}, "", ""});
    const LabExperiment& tricks = lab_numbered(labs, 2);
    ASSERT_EQ(tricks.rows.size(), 9u);
    for (const LabRowResult& row : tricks.rows) EXPECT_EQ(row.unavailable, "") << row.name;
    const LabExperiment& precision = lab_numbered(labs, 3);
    EXPECT_EQ(precision.rows[4].name, "fp8 (hybrid) on bf16");
    // What the classifier can run keeps the machine's reasons, and only those: fp8 runs with the
    // model's dropout of 0.1.
    EXPECT_EQ(precision.rows[1].unavailable.empty(), machine.cuda) << precision.rows[1].unavailable;
    for (const size_t i : {0u, 2u, 3u, 4u}) EXPECT_TRUE(precision.rows[i].unavailable.empty()) << precision.rows[i].name;
  }
  // GPT (no dropout by default) runs every row too.
  const std::vector<LabExperiment> gpt = plan_labs(small_base(), LabMachine{false, 0, 2}, {{2, 3}, "", ""});
  for (const LabRowResult& row : gpt[0].rows) EXPECT_TRUE(row.unavailable.empty()) << row.name;
  EXPECT_TRUE(gpt[1].rows[4].unavailable.empty());
}

LabRowResult measured_row(const std::string& name, std::vector<std::pair<std::string, std::string>> settings,
                          double samples_per_second) {
  LabRowResult row;
  row.name = name;
  row.settings = std::move(settings);
  row.measured = LabMeasurement{samples_per_second, 1000.0 / samples_per_second, 1 << 20, 0.1, 0, 3.0};
  return row;
}

TEST(LabPlan, AllTogetherCombinesTheFastestRowOfEachLabLaterLabsWinning) {
  LabExperiment loading{1, "Data pre-loading", "", {}, ""};
  loading.rows = {measured_row("workers 0", {{"num_workers", "0"}}, 10),
                  measured_row("workers 4", {{"num_workers", "4"}}, 30)};
  loading.rows.push_back(LabRowResult{"pinned", {{"pin_memory", "true"}}, 1, false, std::nullopt, "GPU only"});
  LabExperiment tricks{2, "Gradient tricks", "", {}, ""};
  tricks.rows = {measured_row("micro 8", {{"micro_batch_size", "8"}, {"num_workers", "1"}}, 20),
                 measured_row("micro 4", {{"micro_batch_size", "4"}}, 5)};
  const LabExperiment together = plan_all_together({loading, tricks});
  ASSERT_EQ(together.rows.size(), 2u);
  EXPECT_TRUE(together.rows[0].baseline);
  EXPECT_TRUE(together.rows[0].settings.empty());
  EXPECT_EQ(together.rows[1].name, "lab 1: workers 4; lab 2: micro 8");
  EXPECT_EQ(together.rows[1].settings,
            (std::vector<std::pair<std::string, std::string>>{{"micro_batch_size", "8"}, {"num_workers", "1"}}));
  EXPECT_NE(plan_all_together({}).unavailable.find("--labs"), std::string::npos);
}

TEST(LabPlan, SettingsApplyByKeyAndABadValueNamesTheRowAndKey) {
  LabRowResult row{"bad", {{"num_workers", "many"}}, 1, false, std::nullopt, ""};
  const std::string message = error_of([&] { with_settings(small_base(), row); });
  EXPECT_NE(message.find("kiln lab row 'bad', key num_workers"), std::string::npos) << message;
  row.settings = {{"no_such_key", "1"}};
  EXPECT_NE(error_of([&] { with_settings(small_base(), row); }).find("no config key 'no_such_key'"), std::string::npos);
}

TEST(LabResult, TableAndJsonShowEveryRowItsNumbersOrItsReason) {
  LabResults results{"GPT 1 layers x 32", "cpu (2 cores)", 1, 3, {}};
  LabExperiment lab{3, "Mixed precision", "what each format buys", {}, ""};
  lab.rows = {measured_row("fp32", {}, 100), measured_row("bf16", {{"bf16", "true"}}, 150)};
  lab.rows[0].baseline = true;
  lab.rows[1].measured->ratio = 1.5;
  lab.rows.push_back(LabRowResult{"tf32", {{"tf32", "true"}}, 1, false, std::nullopt, "TF32 is a GPU matter"});
  results.labs = {lab, LabExperiment{4, "Storage", "", {}, "nothing is read"}};
  const std::string table = lab_table(results);
  for (const std::string expected :
       {"## lab 3: Mixed precision", "fp32 (baseline)", "150.0", "1.50x", "not run: TF32 is a GPU matter",
        "## lab 4: Storage", "not run: nothing is read", "medians of 3 iterations after 1 warm-up"})
    EXPECT_NE(table.find(expected), std::string::npos) << expected << "\n" << table;
  const nlohmann::json json = nlohmann::json::parse(lab_json(results));
  ASSERT_EQ(json["labs"].size(), 2u);
  const nlohmann::json& rows = json["labs"][0]["rows"];
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1]["samples_per_second"], 150.0);
  EXPECT_EQ(rows[1]["settings"]["bf16"], "true");
  EXPECT_EQ(rows[2]["ran"], false);
  EXPECT_EQ(rows[2]["unavailable"], "TF32 is a GPU matter");
  EXPECT_EQ(json["labs"][1]["unavailable"], "nothing is read");
}

}  // namespace
}  // namespace kiln
