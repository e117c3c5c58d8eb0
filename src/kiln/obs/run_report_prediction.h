// What `kiln estimate` predicts for a training run, recorded at the run's start (the `estimate`
// text summary of its TensorBoard events) so that `kiln report` can set it beside what the run
// measured, for any past run.
//
// predict_run() asks perf/estimator.h about the run's resolved Config: the exact parameter count,
// the model FLOPs of an iteration as the `throughput` tag counts them (the recomputed forward
// included under full recomputation), the memory of one GPU as kiln's buffers hold it (weights,
// gradients, optimizer state, activations, the CUDA back-end's op scratch), and, on a GPU of the
// datasheet table, the roofline's least time per iteration and so the most tokens per second (what
// `kiln train` prints on a GPU). Elsewhere (the CPU) there is no time to predict, and `no_time_because`
// says why. A config the estimator refuses (a GPU without tensor cores for the precision) gives a
// prediction holding only `unavailable`, the estimator's reason; the run goes on.
//
// The JSON has these keys, numbers in bytes, seconds and FLOPs; the optional ones are left out
// when absent: device, gpu, parameters, flops_per_iteration, tokens_per_iteration,
// data_parallel_size, memory_bytes_per_gpu, seconds_per_iteration, tokens_per_second,
// no_time_because, unavailable. prediction_from_json() refuses text that is not such an object with a
// kiln::Error naming `source` and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/train/config.h"

namespace kiln {

struct RunPrediction {
  std::string device;  // the back-end's description: "cpu, 2 threads", "NVIDIA H100 80GB HBM3"
  std::string gpu;     // the datasheet of the device ("h100-sxm"); empty where none matches
  int64_t parameters = 0;
  double flops_per_iteration = 0;
  int64_t tokens_per_iteration = 0;  // global batch x sequence length
  int64_t data_parallel_size = 1;
  double memory_bytes_per_gpu = 0;
  std::optional<double> seconds_per_iteration;  // the roofline's least, on the datasheet's GPU
  std::optional<double> tokens_per_second;      // the roofline's most, all GPUs together
  std::string no_time_because;                  // why there is no time (no datasheet for the device)
  std::string unavailable;                      // non-empty: the estimator refused the config, why
};

// `config` resolved; `device` the back-end's description().
RunPrediction predict_run(const Config& config, const std::string& device);

std::string to_json(const RunPrediction& prediction);
RunPrediction prediction_from_json(std::string_view json, const std::string& source);

}  // namespace kiln
