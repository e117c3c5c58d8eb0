#include "kiln/obs/log_line.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln {

std::string format_log_line(const IterationStats& s) {
  // With many ranks, the wait for the gradients' reduction that the backward did not hide, and its spread over them.
  std::string reduction;
  if (s.data_parallel_size > 1) {
    reduction = fmt::format(" grads reduce wait (ms): {:.2f}", s.grad_reduce_wait_ms);
    const std::vector<double>& waits = s.grad_reduce_wait_ms_by_rank;
    if (!waits.empty()) {
      const auto [shortest, longest] = std::minmax_element(waits.begin(), waits.end());
      reduction += fmt::format(" (ranks {:.2f}-{:.2f}, longest rank {})", *shortest, *longest, longest - waits.begin());
    }
    reduction += " |";
  }
  return fmt::format(
      " iteration {:>8d}/{:>8d} | consumed samples: {:>12d} | elapsed time per iteration (ms): {:.1f} "
      "| throughput per GPU (TFLOP/s/GPU): {:.3f} | tokens per second: {:.1f} | learning rate: {:.6E} "
      "| global batch size: {:>5d} | lm loss: {:.6E} | loss scale: {:.1f} | grad norm: {:.3f} "
      "| number of skipped iterations: {:>3d} | number of nan iterations: {:>3d} |{}",
      s.iteration, s.train_iters, s.consumed_samples, s.elapsed_ms, s.tflops_per_gpu,
      s.tokens_per_second, s.learning_rate, s.global_batch_size, s.lm_loss, s.loss_scale,
      s.grad_norm, s.skipped_iterations, s.nan_iterations, reduction);
}

std::string format_validation_line(const ValidationStats& s) {
  const std::string where = s.at_end ? fmt::format("the end of training ({})", s.iteration)
                                     : fmt::format("iteration {}", s.iteration);
  if (s.classification)
    return fmt::format(" validation loss at {} | loss value: {:.6E} | accuracy: {:.4f} | F1: {:.4f} | samples: {} |",
                       where, s.lm_loss, s.classification->accuracy, s.classification->f1, s.classification->samples);
  return fmt::format(" validation loss at {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", where,
                     s.lm_loss, s.perplexity);
}

LogLineObserver::LogLineObserver(int64_t log_interval, std::FILE* out)
    : log_interval_(log_interval), out_(out) {}

void LogLineObserver::on_iteration(const IterationStats& stats) {
  // Averages over the interval for time, rates and loss; the rest from the latest iteration.
  sum_.elapsed_ms += stats.elapsed_ms;
  sum_.tflops_per_gpu += stats.tflops_per_gpu;
  sum_.tokens_per_second += stats.tokens_per_second;
  sum_.grad_reduce_wait_ms += stats.grad_reduce_wait_ms;
  sum_.grad_reduce_wait_ms_by_rank.resize(stats.grad_reduce_wait_ms_by_rank.size(), 0.0);
  for (size_t rank = 0; rank < stats.grad_reduce_wait_ms_by_rank.size(); ++rank)
    sum_.grad_reduce_wait_ms_by_rank[rank] += stats.grad_reduce_wait_ms_by_rank[rank];
  if (!stats.skipped && std::isfinite(stats.lm_loss)) {
    sum_.lm_loss += stats.lm_loss;
    ++counted_;
  }
  const bool last = stats.iteration == stats.train_iters;
  if (stats.iteration % log_interval_ != 0 && !last) return;
  const int64_t window = stats.iteration % log_interval_ ? stats.iteration % log_interval_ : log_interval_;
  IterationStats line = stats;
  line.elapsed_ms = sum_.elapsed_ms / static_cast<double>(window);
  line.tflops_per_gpu = sum_.tflops_per_gpu / static_cast<double>(window);
  line.tokens_per_second = sum_.tokens_per_second / static_cast<double>(window);
  line.grad_reduce_wait_ms = sum_.grad_reduce_wait_ms / static_cast<double>(window);
  line.grad_reduce_wait_ms_by_rank = sum_.grad_reduce_wait_ms_by_rank;
  for (double& wait : line.grad_reduce_wait_ms_by_rank) wait /= static_cast<double>(window);
  line.lm_loss = counted_ ? sum_.lm_loss / static_cast<double>(counted_) : NAN;
  std::fputs((format_log_line(line) + "\n").c_str(), out_);
  std::fflush(out_);
  sum_ = IterationStats{};
  counted_ = 0;
}

void LogLineObserver::on_validation(const ValidationStats& stats) {
  const std::string line = format_validation_line(stats);
  const std::string rule(line.size(), '-');
  std::fputs((rule + "\n" + line + "\n" + rule + "\n").c_str(), out_);
  std::fflush(out_);
}

void LogLineObserver::on_checkpoint(int64_t iteration, const std::string& dir) {
  std::fputs(fmt::format("saved checkpoint at iteration {:>7d} to {}\n", iteration, dir).c_str(), out_);
  std::fflush(out_);
}

void LogLineObserver::on_message(const std::string& text) {
  std::fputs((text + "\n").c_str(), out_);
  std::fflush(out_);
}

}  // namespace kiln
