// PrometheusObserver: the Trainer's step events as Prometheus metrics in a registry that an
// endpoint serves (prometheus_endpoint.h). Every iteration sets, in base units:
//   kiln_iterations_total                    iterations completed (a resumed run starts at its
//   checkpoint's) kiln_train_iterations                    iterations the run trains for
//   (--train-iters) kiln_consumed_samples_total              samples the whole run has consumed,
//   all ranks together kiln_consumed_tokens_total               those samples' tokens (x
//   --seq-length) kiln_skipped_iterations_total            steps skipped for an fp16 overflow
//   kiln_lm_loss                             training loss, mean over the global batch
//   kiln_learning_rate                       the step's learning rate
//   kiln_loss_scale                          fp16 loss scale (1 without fp16)
//   kiln_gradient_norm                       global gradient norm, unscaled, before clipping
//   kiln_tokens_per_second                   the run's tokens per second, all ranks together
//   kiln_model_flops_per_second              model FLOPs per second of one GPU (Megatron's
//   TFLOP/s/GPU x 1e12) kiln_model_flops_utilization_ratio       that over the GPU's datasheet peak
//   (MFU); only when the peak is known kiln_data_wait_seconds_total             time the step
//   waited for the data loader kiln_gradient_reduce_wait_seconds_total  time it waited for the
//   gradients' reduction over ranks kiln_iteration_duration_seconds          histogram of the
//   iterations' wall time
// and every validation:
//   kiln_validation_lm_loss                  mean validation loss
// The values of a step are the same on every rank (the Trainer reduces them) except the waits and
// durations, which are the rank's own.
//
// Called on the training thread; each update holds the registry's mutex for a few numbers.
#pragma once

#include <cstdint>

#include "kiln/obs/observer.h"
#include "kiln/obs/prometheus_registry.h"

namespace kiln {

struct PrometheusObserverOptions {
  int64_t seq_length = 0;  // tokens per sample
  double peak_flops_per_second =
      0;  // the GPU's datasheet peak at the run's precision; 0: unknown, no MFU
};

class PrometheusObserver : public TrainObserver {
 public:
  // Adds the metrics to `registry`, which must outlive this.
  PrometheusObserver(PrometheusRegistry& registry, const PrometheusObserverOptions& options);
  void on_iteration(const IterationStats& stats) override;
  void on_validation(const ValidationStats& stats) override;

 private:
  using Metric = PrometheusRegistry::Metric;

  PrometheusRegistry& registry_;
  PrometheusObserverOptions options_;
  Metric iterations_, train_iterations_, consumed_samples_, consumed_tokens_, skipped_iterations_,
      lm_loss_, learning_rate_, loss_scale_, gradient_norm_, tokens_per_second_, model_flops_,
      model_flops_utilization_, data_wait_, gradient_reduce_wait_, iteration_duration_,
      validation_lm_loss_, validation_accuracy_, validation_f1_;
};

}  // namespace kiln
