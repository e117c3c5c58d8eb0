// TensorBoardObserver: Megatron-LM's TensorBoard scalars (megatron/training/training.py,
// training_log() and evaluate_and_print_results()), so a Megatron user's dashboards keep working.
// Every scalar is written twice: `<tag>` at the iteration, and `<tag> vs samples` at the samples
// consumed by then.
//
// Every `log_interval` iterations (--tensorboard-log-interval), the values of that iteration:
//   lm loss            mean training loss over the global batch
//   learning-rate      the learning rate of the step
//   loss-scale         the fp16 loss scale (1 without fp16)
//   grad-norm          the global gradient norm, unscaled, before clipping
//   batch-size         samples per step (the global batch), with log_batch_size
//   world-size         data-parallel ranks, with log_world_size
// and, with log_memory (--log-memory-to-tensorboard), memory at the end of that iteration, in bytes
// (Megatron's tags, which read PyTorch's caching allocator; kiln allocates every buffer before
// the first step and never frees one while training, so allocated is also what it holds):
//   mem-allocated-bytes       the bytes in the back-end's buffers
//   mem-max-allocated-bytes   the most it held at once so far
//   mem-reserved-bytes        on a GPU, the device's bytes in use as its driver reports them
//                             (kiln's, cuBLAS', cuDNN's, NCCL's and the context's); on the CPU,
//                             the allocated bytes
// and, with log_timers (--log-timers-to-tensorboard), means over the iterations since the
// previous write, in seconds as Megatron's timers are:
//   iteration-time         wall time of an iteration
//   throughput             TFLOP/s per GPU (model FLOPs / time), as Megatron's log line and tag
//   batch-generator-time   the wait for the data loader's batches (Megatron's timer of that name)
//   all-grads-sync-time    the wait for the gradients' reduction over ranks that the backward did
//                          not hide (Megatron's timer of the gradient all-reduce)
// After each validation (any iteration):
//   lm loss validation       mean validation loss
//   lm loss validation ppl   its perplexity, exp(loss), with log_validation_ppl
// At the start of a run, write_run_start(), two text summaries (TensorBoard's Text tab) at the
// iteration the run starts from, which `kiln report` reads back:
//   config     the resolved config as YAML, what `kiln train --print-config` prints
//   estimate   what `kiln estimate` predicts for it on this device, JSON (obs/run_report_prediction.h)
//
// Registered on rank 0 only; called on the training thread; the writer takes the disk off it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "kiln/obs/observer.h"
#include "kiln/obs/tensorboard_writer.h"

namespace kiln {

inline constexpr std::string_view kConfigTextTag = "config";
inline constexpr std::string_view kEstimateTextTag = "estimate";

struct TensorBoardOptions {
  int64_t log_interval = 1;         // --tensorboard-log-interval
  bool log_timers = false;          // --log-timers-to-tensorboard
  bool log_batch_size = false;      // --log-batch-size-to-tensorboard
  bool log_world_size = false;      // --log-world-size-to-tensorboard
  bool log_memory = false;          // --log-memory-to-tensorboard
  bool log_validation_ppl = false;  // --log-validation-ppl-to-tensorboard
};

class TensorBoardObserver : public TrainObserver {
 public:
  // `consumed_samples`: the run's count at its start (a resumed run's), the `vs samples` step of a
  // validation before any iteration.
  TensorBoardObserver(std::unique_ptr<TensorBoardWriter> writer, const TensorBoardOptions& options,
                      int64_t consumed_samples);
  // The run's config (YAML) and estimate (JSON) at `iteration`, before its first step.
  void write_run_start(std::string_view config_yaml, std::string_view estimate_json, int64_t iteration);
  void on_iteration(const IterationStats& stats) override;
  void on_validation(const ValidationStats& stats) override;

  TensorBoardWriter& writer() { return *writer_; }

 private:
  void write(std::string_view tag, double value, int64_t iteration);  // and `<tag> vs samples`

  std::unique_ptr<TensorBoardWriter> writer_;
  TensorBoardOptions options_;
  int64_t consumed_samples_;
  // Timers summed over the iterations since the last write.
  IterationStats timer_sums_;
  int64_t timed_iterations_ = 0;
};

}  // namespace kiln
