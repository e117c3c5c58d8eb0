// Observers watch the Trainer's step events (ARCHITECTURE.md decision 6); nothing inside layers
// calls them. The Trainer calls them on its own thread, in registration order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms = 0;       // wall time of this iteration
  double data_wait_ms = 0;     // of which the training thread waited for batches
  double grad_reduce_wait_ms = 0;  // of which it waited for the gradients' reduction over ranks
  // With many ranks, every rank's grad_reduce_wait_ms, in rank order (empty with one). The rank
  // whose backward ends last waits only for what its backward did not hide; the others wait for
  // it too, so the spread is the ranks' skew.
  std::vector<double> grad_reduce_wait_ms_by_rank;
  int64_t data_parallel_size = 1;
  double tflops_per_gpu = 0;   // model FLOPs (PERF.md formula) / time
  double tokens_per_second = 0;
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;          // mean over the global batch
  double loss_scale = 1;
  double grad_norm = 0;        // before clipping, after unscaling
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
  bool skipped = false;
  // Memory at the end of the step: the bytes the back-end holds in its buffers (all of kiln's
  // device memory), the most it held at once so far, and, on a GPU, the device's bytes in use as
  // its driver reports them (kiln's, the libraries' and the context's; 0 on the CPU).
  int64_t memory_allocated_bytes = 0;
  int64_t memory_max_allocated_bytes = 0;
  int64_t device_memory_used_bytes = 0;
};

// A classifier's validation scores (nn/classification_metrics.h).
struct ClassificationScores {
  double accuracy = 0, f1 = 0;
  int64_t samples = 0;
};

struct ValidationStats {
  int64_t iteration = 0;
  double lm_loss = 0;     // the mean validation loss (a classifier's cross-entropy over its labels)
  double perplexity = 0;  // exp(lm_loss): meaningful for a language model
  bool at_end = false;
  std::optional<ClassificationScores> classification;  // set for a model that classifies samples
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_iteration_begin(int64_t /*iteration*/) {}  // before the step of that iteration
  virtual void on_iteration(const IterationStats&) {}
  virtual void on_validation(const ValidationStats&) {}
  virtual void on_checkpoint(int64_t /*iteration*/, const std::string& /*dir*/) {}
  virtual void on_message(const std::string& /*text*/) {}
};

}  // namespace kiln
