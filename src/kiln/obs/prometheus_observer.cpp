#include "kiln/obs/prometheus_observer.h"

#include <vector>

namespace kiln {
namespace {

// Wall time of an iteration, in seconds: a tiny CPU model's milliseconds up to a large model's
// minute; Prometheus's histogram_quantile() interpolates within a bucket.
const std::vector<double> kIterationBuckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1,      2.5,   5,    10,    25,   60};

}  // namespace

PrometheusObserver::PrometheusObserver(PrometheusRegistry& registry,
                                       const PrometheusObserverOptions& options)
    : registry_(registry),
      options_(options),
      iterations_(registry.add_counter("kiln_iterations_total", "Training iterations completed.")),
      train_iterations_(registry.add_gauge("kiln_train_iterations",
                                           "Iterations the run trains for (--train-iters).")),
      consumed_samples_(
          registry.add_counter("kiln_consumed_samples_total",
                               "Training samples consumed by the run, all ranks together.")),
      consumed_tokens_(
          registry.add_counter("kiln_consumed_tokens_total",
                               "Training tokens consumed by the run, all ranks together.")),
      skipped_iterations_(
          registry.add_counter("kiln_skipped_iterations_total",
                               "Iterations whose update was skipped for an fp16 overflow.")),
      lm_loss_(registry.add_gauge(
          "kiln_lm_loss", "Training loss of the last iteration, mean over the global batch.")),
      learning_rate_(
          registry.add_gauge("kiln_learning_rate", "Learning rate of the last iteration.")),
      loss_scale_(registry.add_gauge("kiln_loss_scale",
                                     "fp16 loss scale of the last iteration (1 without fp16).")),
      gradient_norm_(registry.add_gauge(
          "kiln_gradient_norm",
          "Global gradient norm of the last iteration, unscaled, before clipping.")),
      tokens_per_second_(
          registry.add_gauge("kiln_tokens_per_second",
                             "Tokens per second of the last iteration, all ranks together.")),
      model_flops_(
          registry.add_gauge("kiln_model_flops_per_second",
                             "Model FLOPs per second of this rank's GPU in the last iteration.")),
      model_flops_utilization_(
          registry.add_gauge("kiln_model_flops_utilization_ratio",
                             "Model FLOPs per second over the GPU's datasheet peak (MFU).")),
      data_wait_(
          registry.add_counter("kiln_data_wait_seconds_total",
                               "Time the training thread waited for the data loader, in seconds.")),
      gradient_reduce_wait_(registry.add_counter(
          "kiln_gradient_reduce_wait_seconds_total",
          "Time the training thread waited for the gradients' reduction over ranks, in seconds.")),
      iteration_duration_(registry.add_histogram(
          "kiln_iteration_duration_seconds", "Wall time of the training iterations, in seconds.",
          kIterationBuckets)),
      validation_lm_loss_(registry.add_gauge("kiln_validation_lm_loss",
                                             "Mean validation loss of the last validation.")),
      validation_accuracy_(registry.add_gauge("kiln_validation_accuracy",
                                              "A classifier's share of correct validation predictions (0 to 1).")),
      validation_f1_(registry.add_gauge("kiln_validation_f1",
                                        "A classifier's validation F1: the positive label's with two labels, else "
                                        "the mean over labels.")) {}

void PrometheusObserver::on_iteration(const IterationStats& stats) {
  registry_.set(iterations_, static_cast<double>(stats.iteration));
  registry_.set(train_iterations_, static_cast<double>(stats.train_iters));
  registry_.set(consumed_samples_, static_cast<double>(stats.consumed_samples));
  registry_.set(consumed_tokens_,
                static_cast<double>(stats.consumed_samples * options_.seq_length));
  registry_.set(skipped_iterations_, static_cast<double>(stats.skipped_iterations));
  registry_.set(lm_loss_, stats.lm_loss);
  registry_.set(learning_rate_, stats.learning_rate);
  registry_.set(loss_scale_, stats.loss_scale);
  registry_.set(gradient_norm_, stats.grad_norm);
  registry_.set(tokens_per_second_, stats.tokens_per_second);
  const double flops_per_second = stats.tflops_per_gpu * 1e12;
  registry_.set(model_flops_, flops_per_second);
  if (options_.peak_flops_per_second > 0)
    registry_.set(model_flops_utilization_, flops_per_second / options_.peak_flops_per_second);
  registry_.increment(data_wait_, stats.data_wait_ms * 1e-3);
  registry_.increment(gradient_reduce_wait_, stats.grad_reduce_wait_ms * 1e-3);
  registry_.observe(iteration_duration_, stats.elapsed_ms * 1e-3);
}

void PrometheusObserver::on_validation(const ValidationStats& stats) {
  registry_.set(validation_lm_loss_, stats.lm_loss);
  if (stats.classification) {
    registry_.set(validation_accuracy_, stats.classification->accuracy);
    registry_.set(validation_f1_, stats.classification->f1);
  }
}

}  // namespace kiln
