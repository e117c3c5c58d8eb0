#include "kiln/perf/flops.h"

namespace kiln {

double flops_per_iteration(const FlopsShape& shape, bool full_recompute) {
  const double B = static_cast<double>(shape.global_batch), s = static_cast<double>(shape.seq);
  const double l = static_cast<double>(shape.layers), h = static_cast<double>(shape.hidden);
  const double V = static_cast<double>(shape.vocab);
  const double leading = (full_recompute ? 96.0 : 72.0) * B * s * l * h * h;
  const double vocab_term = V / ((full_recompute ? 16.0 : 12.0) * l * h);
  return leading * (1.0 + s / (6.0 * h) + vocab_term);
}

double encoder_flops_per_iteration(const EncoderFlopsShape& shape, bool full_recompute) {
  const double B = static_cast<double>(shape.global_batch), s = static_cast<double>(shape.seq);
  const double l = static_cast<double>(shape.layers), h = static_cast<double>(shape.hidden);
  const double J = static_cast<double>(shape.intermediate_layers), L = static_cast<double>(shape.labels);
  const double forward_per_sample = s * (l * (24.0 * h * h + 4.0 * s * h) + 2.0 * J * h * h) + 4.0 * h * h + 2.0 * h * L;
  return (full_recompute ? 4.0 : 3.0) * B * forward_per_sample;
}

double gpt_closed_form_parameters(int64_t layers, int64_t hidden, int64_t vocab, int64_t positions) {
  const double l = static_cast<double>(layers), h = static_cast<double>(hidden);
  const double V = static_cast<double>(vocab), P = static_cast<double>(positions);
  return 12 * l * h * h * (1 + 13 / (12 * h) + (V + P) / (12 * l * h));
}

double encoder_closed_form_parameters(int64_t layers, int64_t hidden, int64_t vocab, int64_t positions,
                                      int64_t intermediate_layers, int64_t labels) {
  const double h = static_cast<double>(hidden), J = static_cast<double>(intermediate_layers);
  const double L = static_cast<double>(labels);
  return gpt_closed_form_parameters(layers, hidden, vocab, positions) + (J + 2) * h * h + (J + 6) * h + (h + 1) * L;
}

double achieved_tflops(double flops, double seconds_per_iteration, int64_t gpus) {
  if (seconds_per_iteration <= 0 || gpus <= 0) return 0.0;
  return flops / (seconds_per_iteration * static_cast<double>(gpus) * 1e12);
}

double attention_forward_flops(int64_t batch, int64_t seq, int64_t hidden, bool causal) {
  const double B = static_cast<double>(batch), T = static_cast<double>(seq), C = static_cast<double>(hidden);
  return 4.0 * B * T * T * C * (causal ? 0.5 : 1.0);
}

}  // namespace kiln
