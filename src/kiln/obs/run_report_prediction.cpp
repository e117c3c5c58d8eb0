#include "kiln/obs/run_report_prediction.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/core/json_numbers.h"
#include "kiln/perf/estimator.h"
#include "kiln/perf/gpu_specs.h"

namespace kiln {
namespace {

// The estimator's input for a resolved Config (kiln is data-parallel only; ZeRO-1 is
// --use-distributed-optimizer). Without a datasheet for the device the estimator's default GPU
// stands in: the parameters, FLOPs and memory do not depend on it, and no time is taken from it.
EstimateInput estimate_input(const Config& config, const std::optional<GpuSpec>& gpu) {
  EstimateInput in;
  in.model = config.model;
  in.num_intermediate_layers = config.num_intermediate_layers;
  in.num_labels = config.num_labels;
  in.num_layers = config.num_layers;
  in.hidden_size = config.hidden_size;
  in.num_attention_heads = config.num_attention_heads;
  in.seq_length = config.seq_length;
  in.vocab_size = config.vocab_size;
  in.global_batch_size = config.global_batch_size;
  in.micro_batch_size = config.micro_batch_size;
  in.gpus = config.data_parallel_size;
  if (gpu) in.gpu = gpu->key;
  in.precision = config.precision_name();
  in.fp8_format = config.fp8_format;
  in.fp8_amax_history_len = config.fp8_amax_history_len;
  in.fp8_classifier = config.fp8_classifier;
  in.loss_chunk_rows = config.loss_chunk_rows;
  in.zero_stage = config.use_distributed_optimizer ? 1 : 0;
  in.recompute = config.recompute_policy();
  in.deterministic_attention = config.deterministic_attention;
  return in;
}

double number_at(const nlohmann::json& object, const char* key, const std::string& source) {
  KILN_CHECK(object.contains(key), "{}: '{}' is missing", source, key);
  const nlohmann::json& value = object[key];
  KILN_CHECK(value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0,
             "{}: '{}' is {}, not a number >= 0", source, key, value.dump());
  return value.get<double>();
}

std::string string_at(const nlohmann::json& object, const char* key, const std::string& source) {
  if (!object.contains(key)) return "";
  KILN_CHECK(object[key].is_string(), "{}: '{}' is {}, not a string", source, key, object[key].dump());
  return object[key].get<std::string>();
}

}  // namespace

RunPrediction predict_run(const Config& config, const std::string& device) {
  RunPrediction prediction;
  prediction.device = device;
  prediction.tokens_per_iteration = config.global_batch_size * config.seq_length;
  prediction.data_parallel_size = config.data_parallel_size;
  const std::optional<GpuSpec> gpu = find_gpu_by_device_name(device);
  Estimate estimated;
  try {
    estimated = estimate(estimate_input(config, gpu));
  } catch (const Error& refused) {
    prediction.unavailable = refused.what();
    return prediction;
  }
  prediction.parameters = estimated.parameters_exact;
  prediction.flops_per_iteration = estimated.flops_per_iteration;
  prediction.memory_bytes_per_gpu = estimated.memory.total();
  if (gpu) {
    prediction.gpu = gpu->key;
    prediction.seconds_per_iteration = estimated.roofline.ms * 1e-3;
    prediction.tokens_per_second =
        estimated.roofline_tokens_per_second * static_cast<double>(config.data_parallel_size);
  } else {
    prediction.no_time_because =
        "kiln estimate times the GPUs of its datasheet table (kiln estimate --gpu) alone, not '" + device + "'";
  }
  return prediction;
}

std::string to_json(const RunPrediction& prediction) {
  nlohmann::json out = {{"device", prediction.device},
                        {"gpu", prediction.gpu},
                        {"parameters", prediction.parameters},
                        {"flops_per_iteration", prediction.flops_per_iteration},
                        {"tokens_per_iteration", prediction.tokens_per_iteration},
                        {"data_parallel_size", prediction.data_parallel_size},
                        {"memory_bytes_per_gpu", prediction.memory_bytes_per_gpu}};
  if (prediction.seconds_per_iteration) out["seconds_per_iteration"] = *prediction.seconds_per_iteration;
  if (prediction.tokens_per_second) out["tokens_per_second"] = *prediction.tokens_per_second;
  if (!prediction.no_time_because.empty()) out["no_time_because"] = prediction.no_time_because;
  if (!prediction.unavailable.empty()) out["unavailable"] = prediction.unavailable;
  return out.dump();
}

RunPrediction prediction_from_json(std::string_view json, const std::string& source) {
  const nlohmann::json object = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  KILN_CHECK(object.is_object(), "{}: not a JSON object: '{}'", source, json.substr(0, 80));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  RunPrediction prediction;
  prediction.device = string_at(object, "device", source);
  prediction.gpu = string_at(object, "gpu", source);
  prediction.parameters = json_int64_at(object, "parameters", 0, kMax, source);
  prediction.flops_per_iteration = number_at(object, "flops_per_iteration", source);
  prediction.tokens_per_iteration = json_int64_at(object, "tokens_per_iteration", 0, kMax, source);
  prediction.data_parallel_size = json_int64_at(object, "data_parallel_size", 1, kMax, source);
  prediction.memory_bytes_per_gpu = number_at(object, "memory_bytes_per_gpu", source);
  if (object.contains("seconds_per_iteration"))
    prediction.seconds_per_iteration = number_at(object, "seconds_per_iteration", source);
  if (object.contains("tokens_per_second"))
    prediction.tokens_per_second = number_at(object, "tokens_per_second", source);
  prediction.no_time_because = string_at(object, "no_time_because", source);
  prediction.unavailable = string_at(object, "unavailable", source);
  return prediction;
}

}  // namespace kiln
