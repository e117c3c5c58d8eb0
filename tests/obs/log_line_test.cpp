// The log line (obs/log_line.h): Megatron's fields, averaged over the logging interval, and with
// many ranks kiln's reduce wait with its spread over the ranks.
#include "kiln/obs/log_line.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace kiln {
namespace {

IterationStats step(int64_t iteration, double wait_ms, std::vector<double> by_rank) {
  IterationStats stats;
  stats.iteration = iteration;
  stats.train_iters = 4;
  stats.elapsed_ms = 10.0 * static_cast<double>(iteration);
  stats.lm_loss = 2.0;
  stats.data_parallel_size = static_cast<int64_t>(by_rank.size() > 1 ? by_rank.size() : 1);
  stats.grad_reduce_wait_ms = wait_ms;
  stats.grad_reduce_wait_ms_by_rank = std::move(by_rank);
  return stats;
}

// What a LogLineObserver with `interval` prints for `steps`.
std::string printed(int64_t interval, const std::vector<IterationStats>& steps) {
  std::FILE* out = std::tmpfile();
  LogLineObserver log(interval, out);
  for (const IterationStats& stats : steps) log.on_iteration(stats);
  std::rewind(out);
  std::string text;
  for (int c = std::fgetc(out); c != EOF; c = std::fgetc(out)) text += static_cast<char>(c);
  std::fclose(out);
  return text;
}

TEST(LogLine, OneRankHasNoReduceWait) {
  const std::string line = format_log_line(step(1, 0.0, {}));
  EXPECT_NE(line.find(" iteration        1/       4 | consumed samples:"), std::string::npos) << line;
  EXPECT_EQ(line.find("reduce wait"), std::string::npos) << line;
}

TEST(LogLine, ManyRanksShowThisRanksWaitAndTheSpreadOverTheRanksAveragedOverTheInterval) {
  const std::string text = printed(2, {step(1, 1.0, {1.0, 3.0, 0.5}), step(2, 2.0, {2.0, 1.0, 0.5})});
  // Rank 0 waited 1.5 ms on average, rank 1 2.0, rank 2 0.5; the time is averaged too.
  EXPECT_NE(text.find("| elapsed time per iteration (ms): 15.0 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| grads reduce wait (ms): 1.50 (ranks 0.50-2.00, longest rank 1) |\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("iteration        1/"), std::string::npos) << "one line per interval: " << text;
}

}  // namespace
}  // namespace kiln
