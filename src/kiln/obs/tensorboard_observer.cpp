#include "kiln/obs/tensorboard_observer.h"

#include <string>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

TensorBoardObserver::TensorBoardObserver(std::unique_ptr<TensorBoardWriter> writer, const TensorBoardOptions& options,
                                         int64_t consumed_samples)
    : writer_(std::move(writer)), options_(options), consumed_samples_(consumed_samples) {
  KILN_CHECK(writer_ != nullptr, "TensorBoardObserver needs a writer");
  KILN_CHECK(options_.log_interval > 0, "the TensorBoard log interval must be positive, got {}", options_.log_interval);
}

void TensorBoardObserver::write(std::string_view tag, double value, int64_t iteration) {
  const auto scalar = static_cast<float>(value);  // TensorBoard's simple_value is a float
  writer_->add_scalar(tag, scalar, iteration);
  writer_->add_scalar(std::string(tag) + " vs samples", scalar, consumed_samples_);
}

void TensorBoardObserver::write_run_start(std::string_view config_yaml, std::string_view estimate_json,
                                          int64_t iteration) {
  writer_->add_text(kConfigTextTag, config_yaml, iteration);
  writer_->add_text(kEstimateTextTag, estimate_json, iteration);
}

void TensorBoardObserver::on_iteration(const IterationStats& stats) {
  consumed_samples_ = stats.consumed_samples;
  timer_sums_.elapsed_ms += stats.elapsed_ms;
  timer_sums_.tflops_per_gpu += stats.tflops_per_gpu;
  timer_sums_.data_wait_ms += stats.data_wait_ms;
  timer_sums_.grad_reduce_wait_ms += stats.grad_reduce_wait_ms;
  ++timed_iterations_;
  if (stats.iteration % options_.log_interval != 0) return;

  const int64_t it = stats.iteration;
  write("lm loss", stats.lm_loss, it);
  write("learning-rate", stats.learning_rate, it);
  write("loss-scale", stats.loss_scale, it);
  write("grad-norm", stats.grad_norm, it);
  if (options_.log_batch_size) write("batch-size", static_cast<double>(stats.global_batch_size), it);
  if (options_.log_world_size) write("world-size", static_cast<double>(stats.data_parallel_size), it);
  if (options_.log_memory) {
    write("mem-allocated-bytes", static_cast<double>(stats.memory_allocated_bytes), it);
    write("mem-max-allocated-bytes", static_cast<double>(stats.memory_max_allocated_bytes), it);
    write("mem-reserved-bytes",
          static_cast<double>(stats.device_memory_used_bytes > 0 ? stats.device_memory_used_bytes
                                                                 : stats.memory_allocated_bytes),
          it);
  }
  if (options_.log_timers) {
    const double n = static_cast<double>(timed_iterations_);
    write("iteration-time", timer_sums_.elapsed_ms / n * 1e-3, it);
    write("throughput", timer_sums_.tflops_per_gpu / n, it);
    write("batch-generator-time", timer_sums_.data_wait_ms / n * 1e-3, it);
    write("all-grads-sync-time", timer_sums_.grad_reduce_wait_ms / n * 1e-3, it);
  }
  timer_sums_ = IterationStats{};
  timed_iterations_ = 0;
}

void TensorBoardObserver::on_validation(const ValidationStats& stats) {
  write("lm loss validation", stats.lm_loss, stats.iteration);
  if (stats.classification) {
    write("accuracy validation", stats.classification->accuracy, stats.iteration);
    write("f1 validation", stats.classification->f1, stats.iteration);
  } else if (options_.log_validation_ppl) {
    write("lm loss validation ppl", stats.perplexity, stats.iteration);
  }
}

}  // namespace kiln
