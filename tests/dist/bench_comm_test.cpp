// `kiln bench comm` over real Gloo ranks started by `kiln launch`, by a real Slurm's srun (and alone,
// without a launcher): every op and size present, results checked, busbw = algbw x nccl-tests'
// factor, a corrupted rank caught, the JSON form, and flags that name themselves when wrong.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/kiln_process.h"
#include "support/slurm_cluster.h"

namespace kiln {
namespace {

using testing::CommandResult;
using testing::kiln_binary;
using testing::run_command;

const std::vector<std::string> kOps = {"all_reduce", "all_gather", "reduce_scatter", "reduce", "broadcast"};
constexpr const char* kFast = "--iters 3 --warmup-iters 1 --distributed-timeout-minutes 0.5";

CommandResult launch(int ranks, const std::string& arguments) {
  return run_command(fmt::format(
      "OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node {} -- {} bench comm {}",
      kiln_binary(), ranks, kiln_binary(), arguments));
}

// No launcher, and none of a launcher's variables inherited: a single process.
CommandResult alone(const std::string& arguments) {
  return run_command(fmt::format("env -u RANK -u WORLD_SIZE -u SLURM_PROCID {} bench comm {}",
                                 kiln_binary(), arguments));
}

struct TableRow {
  std::string op;
  int64_t size = 0, count = 0;
  std::string type, redop;
  int root = 0;
  double time = 0, algbw = 0, busbw = 0;
  std::string wrong;
};

// The output's lines, rank 0's with their "[rank 0] " prefix removed.
std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) {
    if (line.starts_with("[rank 0] ")) line = line.substr(9);
    lines.push_back(line);
  }
  return lines;
}

std::vector<TableRow> table_rows(const std::string& output) {
  std::vector<TableRow> rows;
  for (const std::string& line : lines_of(output)) {
    std::istringstream fields(line);
    TableRow row;
    if (!(fields >> row.op >> row.size >> row.count >> row.type >> row.redop >> row.root >>
          row.time >> row.algbw >> row.busbw >> row.wrong))
      continue;
    if (std::find(kOps.begin(), kOps.end(), row.op) != kOps.end()) rows.push_back(row);
  }
  return rows;
}

// The rules the table must follow, stated again here: fp32 elements, at least one; equal shards
// (at least one a rank) for all_gather and reduce_scatter; nccl-tests' bus factors.
int64_t expected_count(const std::string& op, int64_t bytes, int ranks) {
  const int64_t count = std::max<int64_t>(bytes / 4, 1);
  if (op == "all_gather" || op == "reduce_scatter")
    return std::max<int64_t>(count / ranks * ranks, ranks);
  return count;
}

double bus_factor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op == "all_reduce") return 2 * (n - 1) / n;
  if (op == "broadcast" || op == "reduce") return 1;
  return (n - 1) / n;
}

std::vector<int64_t> sizes(int64_t from, int64_t to, int64_t factor) {
  std::vector<int64_t> all;
  for (int64_t size = from; size <= to; size *= factor) all.push_back(size);
  return all;
}

// Rows in the order op by op, size by size; right counts, types, reductions and roots; #wrong 0;
// busbw = algbw x the factor, within the printed columns' rounding (2 decimals).
void expect_table(const std::string& output, int ranks, const std::vector<int64_t>& asked) {
  const std::vector<TableRow> rows = table_rows(output);
  ASSERT_EQ(rows.size(), kOps.size() * asked.size()) << output;
  size_t i = 0;
  for (const std::string& op : kOps)
    for (const int64_t bytes : asked) {
      const TableRow& row = rows[i++];
      SCOPED_TRACE(op + " at " + std::to_string(bytes));
      EXPECT_EQ(row.op, op);
      EXPECT_EQ(row.count, expected_count(op, bytes, ranks));
      EXPECT_EQ(row.size, row.count * 4);
      EXPECT_EQ(row.type, "float");
      EXPECT_EQ(row.redop, op == "all_gather" || op == "broadcast" ? "none" : "sum");
      EXPECT_EQ(row.root, op == "broadcast" || op == "reduce" ? 0 : -1);
      EXPECT_EQ(row.wrong, "0");
      EXPECT_GT(row.time, 0.0);
      EXPECT_NEAR(row.busbw, row.algbw * bus_factor(op, ranks),
                  0.005 + 0.005 * bus_factor(op, ranks) + 1e-9);
    }
  EXPECT_NE(output.find("# Wrong values: 0\n"), std::string::npos) << output;
  EXPECT_NE(output.find("# Avg bus bandwidth    : "), std::string::npos) << output;
}

class BenchCommRanks : public ::testing::TestWithParam<int> {};

TEST_P(BenchCommRanks, EveryOpAndSizeIsRightAndOnlyRankZeroPrints) {
  const int ranks = GetParam();
  const CommandResult result = launch(ranks, fmt::format("-b 8 -e 64K -f 2 {}", kFast));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_table(result.output, ranks, sizes(8, 65536, 2));
  EXPECT_NE(result.output.find(fmt::format("# kiln bench comm | gloo | {} ranks", ranks)),
            std::string::npos)
      << result.output;
  for (int rank = 0; rank < ranks; ++rank)
    EXPECT_NE(result.output.find(fmt::format("#   rank {}: pid", rank)), std::string::npos)
        << result.output;
  for (int rank = 1; rank < ranks; ++rank)
    EXPECT_EQ(result.output.find(fmt::format("[rank {}]", rank)), std::string::npos)
        << result.output;
}

TEST_P(BenchCommRanks, CountsThatAreOddOrNotAMultipleOfTheRanksAreCutIntoEqualShards) {
  // 12, 36, 108 bytes: 3, 9, 27 floats; all_gather and reduce_scatter round down to whole shards.
  const int ranks = GetParam();
  const CommandResult result = launch(ranks, fmt::format("-b 12 -e 108 -f 3 {}", kFast));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  expect_table(result.output, ranks, {12, 36, 108});
}

INSTANTIATE_TEST_SUITE_P(BenchComm, BenchCommRanks, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// srun starts the ranks with no wrapper and no MASTER_PORT (derived from the job id): the same
// table as under kiln launch, printed once (srun merges the tasks' output unprefixed).
TEST(BenchComm, RunsUnderSrunAsUnderKilnLaunch) {
  const testing::SlurmCluster cluster;
  if (!cluster.available()) GTEST_SKIP() << cluster.reason();
  const CommandResult result = run_command(fmt::format(
      "{}export OMP_NUM_THREADS=1; timeout -k 10 120 {} -n 2 --ntasks-per-node 2 --kill-on-bad-exit=1 {} bench comm "
      "-b 8 -e 64K -f 2 {}",
      cluster.command_prefix(), cluster.srun(), kiln_binary(), kFast));
  ASSERT_EQ(result.exit_code, 0) << result.output << "\n" << cluster.logs();
  expect_table(result.output, 2, sizes(8, 65536, 2));
  EXPECT_NE(result.output.find("# kiln bench comm | gloo | 2 ranks"), std::string::npos) << result.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(result.output.find(fmt::format("#   rank {}: pid", rank)), std::string::npos) << result.output;
}

TEST(BenchComm, ACorruptedRankIsCountedOnTheRanksThatSeeItAndFailsTheRun) {
  const CommandResult result = launch(2, fmt::format("-b 8 -e 32 --corrupt-rank 1 {}", kFast));
  EXPECT_NE(result.exit_code, 0) << result.output;
  const std::vector<TableRow> rows = table_rows(result.output);
  ASSERT_EQ(rows.size(), 5u * 3u) << result.output;
  // Rank 1's extra 1 reaches every rank's all_reduce sum and every rank's copy of its all_gather
  // shard; reduce_scatter's wrong element is in rank 1's own shard; reduce's in the root's sum;
  // broadcast overwrites it.
  for (const TableRow& row : rows) {
    const std::string expected = row.op == "reduce_scatter" || row.op == "reduce" ? "1"
                                 : row.op == "broadcast"                          ? "0"
                                                                                  : "2";
    EXPECT_EQ(row.wrong, expected) << row.op << " at " << row.size;
  }
  EXPECT_NE(result.output.find("# Wrong values: 18\n"), std::string::npos) << result.output;
  EXPECT_NE(
      result.output.find(
          "kiln: error: kiln bench comm: 18 wrong values (first: all_reduce at size 8 on rank 0)"),
      std::string::npos)
      << result.output;
}

TEST(BenchComm, JsonIsOneDocumentWithEveryRow) {
  const CommandResult result = launch(2, fmt::format("-b 8 -e 4K -f 8 --json {}", kFast));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<nlohmann::json> documents;
  for (const std::string& line : lines_of(result.output))
    if (line.starts_with("{")) documents.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(documents.size(), 1u) << result.output;
  const nlohmann::json& out = documents.front();
  EXPECT_EQ(out["backend"], "gloo");
  EXPECT_EQ(out["world_size"], 2);
  EXPECT_EQ(out["wrong"], 0);
  EXPECT_EQ(out["ranks"].size(), 2u);
  const std::vector<int64_t> asked = sizes(8, 4096, 8);
  ASSERT_EQ(out["rows"].size(), kOps.size() * asked.size()) << out.dump(2);
  double busbw_sum = 0;
  size_t i = 0;
  for (const std::string& op : kOps)
    for (const int64_t bytes : asked) {
      const nlohmann::json& row = out["rows"][i++];
      EXPECT_EQ(row["op"], op);
      EXPECT_EQ(row["count"], expected_count(op, bytes, 2));
      EXPECT_EQ(row["size"], 4 * expected_count(op, bytes, 2));
      EXPECT_EQ(row["type"], "float");
      EXPECT_EQ(row["wrong"], 0);
      const double time = row["time_us"], algbw = row["algbw_gbps"], busbw = row["busbw_gbps"];
      EXPECT_NEAR(algbw, row["size"].get<double>() / (time * 1e3), 1e-9 * algbw);
      EXPECT_NEAR(busbw, algbw * bus_factor(op, 2), 1e-9 * algbw);
      busbw_sum += busbw;
    }
  EXPECT_NEAR(out["avg_busbw_gbps"].get<double>(),
              busbw_sum / static_cast<double>(out["rows"].size()), 1e-9 * busbw_sum);
}

TEST(BenchComm, OneProcessWithoutALauncherPrintsTheTableOfOneRank) {
  const CommandResult result = alone("-b 8 -e 1K -f 4 --iters 3 --warmup-iters 1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("# kiln bench comm | single process | 1 rank (a single process)"),
            std::string::npos)
      << result.output;
  expect_table(result.output, 1, sizes(8, 1024, 4));
  // One rank moves nothing between ranks: nccl-tests' factors give busbw 0 but for broadcast and
  // reduce (factor 1).
  for (const TableRow& row : table_rows(result.output))
    if (row.op != "broadcast" && row.op != "reduce") {
      EXPECT_EQ(row.busbw, 0.0) << row.op;
    }
}

TEST(BenchComm, ChecksOffPrintNotApplicable) {
  const CommandResult result =
      alone("-b 8 -e 8 --check 0 --iters 1 --warmup-iters 0 --corrupt-rank 0");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const TableRow& row : table_rows(result.output)) EXPECT_EQ(row.wrong, "N/A");
  EXPECT_NE(result.output.find("# Wrong values: N/A (--check 0)"), std::string::npos)
      << result.output;
}

TEST(BenchComm, BadFlagsNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-b 1K -e 8", "-b/--minbytes 1K is larger than -e/--maxbytes 8"},
      {"-b 0", "-b/--minbytes must be a positive size in bytes, got '0'"},
      {"-e -4", "-e/--maxbytes must be a positive size in bytes, got '-4'"},
      {"-e 12X", "-e/--maxbytes '12X' is not a size in bytes"},
      {"-f 1", "-f/--stepfactor must be at least 2, got 1"},
      {"--ops all_reduce,allreduce",
       "--ops: 'allreduce' is not one of all_reduce, all_gather, reduce_scatter, reduce, broadcast"},
      {"--iters 0", "-n/--iters must be positive, got 0"},
      {"--check 2", "-c/--check takes 1 or 0, got 2"},
      {"--distributed-backend mpi", "--distributed-backend 'mpi' is not gloo or nccl"},
      {"--corrupt-rank 1", "--corrupt-rank 1 is outside the world of 1 rank(s)"},
  };
  for (const auto& [flags, message] : cases) {
    const CommandResult result = alone(flags);
    EXPECT_EQ(result.exit_code, 1) << flags << ": " << result.output;
    EXPECT_NE(result.output.find("kiln: error: " + message), std::string::npos)
        << flags << ": " << result.output;
    EXPECT_EQ(result.output.find("# kiln bench comm"), std::string::npos)
        << flags << ": " << result.output;
  }
}

TEST(BenchComm, RanksStartedWithDifferentOptionsStopNamingTheFlag) {
  const CommandResult result =
      run_command(fmt::format("OMP_NUM_THREADS=1 {} launch --standalone --nproc-per-node 2 -- sh "
                              "-c 'exec {} bench comm -b 8 -e 8 "
                              "--distributed-timeout-minutes 0.5 --iters $((3 + RANK))'",
                              kiln_binary(), kiln_binary()));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(
      result.output.find(
          "rank 1 was started with another configuration than rank 0: --iters is '4' there and "
          "'3' on rank 0"),
      std::string::npos)
      << result.output;
  EXPECT_TRUE(table_rows(result.output).empty()) << result.output;
}

}  // namespace
}  // namespace kiln
