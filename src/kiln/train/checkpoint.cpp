#include "kiln/train/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/json_numbers.h"
#include "kiln/train/safetensors.h"

namespace kiln {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kFp8StateTensor = "fp8_scaling";  // in kOptimizerFile
constexpr const char* kStateFile = "trainer_state.json";
// trainer_state.json's distributed.optimizer_layout: kOptimizerFile holds whole tensors by name,
// which any number of ranks reads. The one layout this kiln writes and reads.
constexpr const char* kGatheredLayout = "gathered";

void append_entries(std::vector<SafetensorsEntry>& entries, const std::string& prefix,
                    const Model& model, const std::vector<float>& host) {
  for (const ParameterInfo& info : model.layout().entries())
    entries.push_back({prefix + info.name, DType::F32, model.stored_shape(info),
                       host.data() + info.offset});
}

// The tensor's bytes where its elements are aligned: the file's own, or a copy in `staging` (a
// file's header may have any length, so its data any alignment).
const void* aligned_data(const SafetensorsEntry& entry, std::vector<float>& staging) {
  const size_t bytes = static_cast<size_t>(entry.shape.numel()) * dtype_size(entry.dtype);
  if (reinterpret_cast<uintptr_t>(entry.data) % dtype_size(entry.dtype) == 0 || bytes == 0) return entry.data;
  staging.resize((bytes + sizeof(float) - 1) / sizeof(float));
  std::memcpy(staging.data(), entry.data, bytes);
  return staging.data();
}

// Reads the tensors named prefix + parameter name into a flat host buffer laid out like the
// model, converting fp16/bf16 to fp32; padding rows (stored_shape) stay zero.
std::vector<float> read_flat(const SafetensorsFile& file, const std::string& prefix, const Model& model) {
  std::vector<float> host(static_cast<size_t>(model.num_parameters()), 0.0f);
  std::vector<float> staging;
  for (const ParameterInfo& info : model.layout().entries()) {
    const std::string name = prefix + info.name;
    const SafetensorsEntry& entry = file.get(name);
    const Shape expected = model.stored_shape(info);
    KILN_CHECK(entry.shape == expected, "{}: tensor '{}' has shape {} but the model needs {}",
               file.path(), name, entry.shape.to_string(), expected.to_string());
    KILN_CHECK(entry.dtype == DType::F32 || entry.dtype == DType::BF16 || entry.dtype == DType::F16,
               "{}: tensor '{}' has dtype {}, expected a floating type", file.path(), name, dtype_name(entry.dtype));
    float* values = host.data() + info.offset;
    widen_to_fp32(aligned_data(entry, staging), entry.dtype, values, expected.numel());
    // Training never keeps a non-finite value (such steps are skipped): one here is damage.
    const float* bad = std::find_if(values, values + expected.numel(), [](float v) { return !std::isfinite(v); });
    KILN_CHECK(bad == values + expected.numel(), "{}: tensor '{}' holds {} at element {} (a damaged file?)",
               file.path(), name, *bad, bad - values);
  }
  return host;
}

// Tensors a Hugging Face GPT-2 file may carry that kiln does not need: the causal-mask buffers
// and the tied classifier.
bool is_ignorable(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name == "lm_head.weight";
}

void reject_unknown(const SafetensorsFile& file, const std::string& prefix, const Model& model) {
  std::set<std::string> expected;
  for (const ParameterInfo& info : model.layout().entries()) expected.insert(prefix + info.name);
  for (const auto& [name, entry] : file.entries())
    KILN_CHECK(is_ignorable(name) || expected.count(name),
               "{}: tensor '{}' does not exist in this model ({} tensors); wrong model or model shape?",
               file.path(), name, model.layout().entries().size());
}

std::string read_text(const std::string& path) {
  std::ifstream stream(path);
  KILN_CHECK(stream.good(), "cannot open '{}'", path);
  std::stringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

nlohmann::json read_state_json(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/" + kStateFile;
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& error) {
    fail("{}: corrupt trainer state: {}", path, error.what());
  }
}

void write_checkpoint_files(const std::string& temp_dir, const Config& config, const Model& model,
                            const OptimizerSnapshot& optimizer, const TrainerState& state, int world_size,
                            bool sharded) {
  const auto count = static_cast<size_t>(model.num_parameters());
  KILN_CHECK(optimizer.master.size() == count && optimizer.exp_avg.size() == count &&
                 optimizer.exp_avg_sq.size() == count,
             "checkpoint: optimizer state of {} / {} / {} values for {} parameters", optimizer.master.size(),
             optimizer.exp_avg.size(), optimizer.exp_avg_sq.size(), count);
  std::vector<SafetensorsEntry> model_entries;
  append_entries(model_entries, "", model, optimizer.master);  // fp32 even under bf16/fp16
  write_safetensors(temp_dir + "/" + kModelFile, model_entries, {{"format", "pt"}});

  std::vector<SafetensorsEntry> optimizer_entries;
  append_entries(optimizer_entries, "exp_avg.", model, optimizer.exp_avg);
  append_entries(optimizer_entries, "exp_avg_sq.", model, optimizer.exp_avg_sq);
  std::vector<float> fp8_state;
  if (model.fp8()) {
    fp8_state = model.fp8()->saved_state();
    optimizer_entries.push_back({kFp8StateTensor, DType::F32, model.fp8()->saved_shape(), fp8_state.data()});
  }
  write_safetensors(temp_dir + "/" + kOptimizerFile, optimizer_entries);

  const nlohmann::json json = {
      {"iteration", state.iteration},
      {"consumed_samples", state.consumed_samples},
      {"skipped_iterations", state.skipped_iterations},
      {"nan_iterations", state.nan_iterations},
      {"optimizer_steps", state.optimizer_steps},
      {"loss_scaler", {{"scale", state.loss_scaler.scale},
                       {"growth_tracker", state.loss_scaler.growth_tracker},
                       {"hysteresis_tracker", state.loss_scaler.hysteresis_tracker}}},
      {"data", {{"seed", config.seed}, {"next_sample_index", state.consumed_samples}}},
      // The optimizer files hold whole tensors by name, whatever wrote them: any number of ranks
      // resumes from them (each takes its shard).
      {"distributed", {{"world_size", world_size},
                       {"optimizer", sharded ? "sharded (ZeRO-1), saved gathered" : "replicated"},
                       {"optimizer_layout", kGatheredLayout}}},
      {"config_yaml", to_yaml(config)},
  };
  write_file_atomically(temp_dir + "/" + kStateFile, json.dump(2) + "\n");
}

}  // namespace

std::string save_checkpoint(const std::string& save_dir, const Config& config, const Model& model,
                            const OptimizerSnapshot& optimizer, const TrainerState& state, int world_size,
                            bool sharded) {
  fs::create_directories(save_dir);
  const std::string name = fmt::format("iter_{:07d}", state.iteration);
  const std::string final_dir = save_dir + "/" + name;
  const std::string temp_dir = fmt::format("{}/{}.tmp-{}", save_dir, name, ::getpid());
  fs::remove_all(temp_dir);
  fs::create_directories(temp_dir);

  try {
    write_checkpoint_files(temp_dir, config, model, optimizer, state, world_size, sharded);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp_dir, ignored);  // a failed save leaves nothing behind
    throw;
  }

  // Swap the finished folder into place; an older folder of the same name is removed only after.
  const std::string old_dir = final_dir + ".old-" + std::to_string(::getpid());
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old_dir);
  fs::rename(temp_dir, final_dir);
  fsync_directory(save_dir);
  write_file_atomically(save_dir + "/" + kTracker, std::to_string(state.iteration) + "\n");
  if (replacing) fs::remove_all(old_dir);
  return final_dir;
}

bool holds_checkpoint(const std::string& dir) {
  std::error_code error;
  return fs::exists(dir + "/" + kModelFile, error) || fs::exists(dir + "/" + kTracker, error);
}

std::string resolve_checkpoint_dir(const std::string& load) {
  std::error_code error;
  KILN_CHECK(fs::is_directory(load, error), "checkpoint folder '{}' does not exist", load);
  if (fs::exists(load + "/" + kModelFile)) return load;
  const std::string tracker = load + "/" + kTracker;
  KILN_CHECK(fs::exists(tracker), "'{}' holds no checkpoint (neither {} nor {})", load, kModelFile,
             kTracker);
  const std::string text = read_text(tracker);
  int64_t iteration = -1;
  try {
    size_t used = 0;
    iteration = std::stoll(text, &used);
    if (text.find_first_not_of(" \t\r\n", used) != std::string::npos) iteration = -1;
  } catch (const std::exception&) {
  }
  KILN_CHECK(iteration >= 0, "{}: expected an iteration number, got '{}'", tracker, text);
  const std::string dir = fmt::format("{}/iter_{:07d}", load, iteration);
  KILN_CHECK(fs::exists(dir + "/" + kModelFile), "{} names iteration {} but {} is missing", tracker,
             iteration, dir + "/" + kModelFile);
  return dir;
}

Config read_checkpoint_config(const std::string& checkpoint_dir) {
  const nlohmann::json json = read_state_json(checkpoint_dir);
  KILN_CHECK(json.contains("config_yaml") && json["config_yaml"].is_string(),
             "{}/{}: no config_yaml entry", checkpoint_dir, kStateFile);
  Config config;
  apply_yaml(config, json["config_yaml"].get<std::string>(),
             checkpoint_dir + "/" + kStateFile + " (config_yaml)");
  return config;
}

TrainerState read_trainer_state(const std::string& checkpoint_dir) {
  const nlohmann::json json = read_state_json(checkpoint_dir);
  const std::string source = checkpoint_dir + "/" + kStateFile;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  TrainerState state;
  state.iteration = json_int64_at(json, "iteration", 0, kMax, source);
  state.consumed_samples = json_int64_at(json, "consumed_samples", 0, kMax, source);
  state.skipped_iterations = json_int64_at(json, "skipped_iterations", 0, kMax, source);
  state.nan_iterations = json_int64_at(json, "nan_iterations", 0, kMax, source);
  state.optimizer_steps = json_int64_at(json, "optimizer_steps", 0, kMax, source);
  KILN_CHECK(json.contains("loss_scaler") && json["loss_scaler"].is_object(), "{}: 'loss_scaler' is missing", source);
  const nlohmann::json& scaler = json["loss_scaler"];
  const std::string scaler_source = source + " (loss_scaler)";
  const double scale = scaler.contains("scale") && scaler["scale"].is_number() ? scaler["scale"].get<double>() : -1.0;
  KILN_CHECK(std::isfinite(scale) && scale > 0 && scale <= std::numeric_limits<float>::max(),
             "{}: 'scale' is {}, not a positive fp32 number", scaler_source,
             scaler.contains("scale") ? scaler["scale"].dump() : "missing");
  state.loss_scaler.scale = static_cast<float>(scale);
  state.loss_scaler.growth_tracker = json_int64_at(scaler, "growth_tracker", 0, kMax, scaler_source);
  // The hysteresis counter goes below zero while overflows continue (loss_scaler.cpp); bounded so
  // that counting on cannot overflow.
  state.loss_scaler.hysteresis_tracker =
      json_int64_at(scaler, "hysteresis_tracker", -(int64_t{1} << 62), kMax, scaler_source);
  // What wrote it; checkpoints from before many ranks have no such entry. A layout other than
  // kGatheredLayout is refused by name, never read as if it were one.
  if (json.contains("distributed")) {
    const nlohmann::json& distributed = json["distributed"];
    KILN_CHECK(distributed.is_object(), "{}: 'distributed' is {}, not an object", source, distributed.dump());
    const std::string distributed_source = source + " (distributed)";
    state.saved_by_ranks = json_int64_at(distributed, "world_size", 1, kMax, distributed_source);
    const nlohmann::json layout = distributed.value("optimizer_layout", nlohmann::json());
    KILN_CHECK(layout == kGatheredLayout,
               "{}: 'optimizer_layout' is {}: this kiln reads only '{}' optimizer files (whole tensors by name, for "
               "any number of ranks)",
               distributed_source, layout.is_null() ? "missing" : layout.dump(), kGatheredLayout);
  }
  return state;
}

std::vector<float> load_model_weights(const std::string& checkpoint_dir, Model& model) {
  const SafetensorsFile file(checkpoint_dir + "/" + kModelFile);
  // Hugging Face's files may prefix the body (GPT2LMHeadModel's "transformer.").
  const std::string foreign(model.hugging_face_prefix());
  const std::string prefix =
      !foreign.empty() && file.contains(foreign + model.layout().entries().front().name) ? foreign : "";
  reject_unknown(file, prefix, model);
  std::vector<float> weights = read_flat(file, prefix, model);
  model.set_parameters(weights);
  return weights;
}

OptimizerSnapshot read_optimizer_state(const std::string& checkpoint_dir, std::vector<float> master_weights,
                                       const Model& model) {
  const SafetensorsFile file(checkpoint_dir + "/" + kOptimizerFile);
  OptimizerSnapshot state{std::move(master_weights), read_flat(file, "exp_avg.", model),
                          read_flat(file, "exp_avg_sq.", model)};
  const auto negative = std::find_if(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), [](float v) { return v < 0; });
  KILN_CHECK(negative == state.exp_avg_sq.end(),
             "{}: a second moment 'exp_avg_sq.*' is negative ({} at flat element {})", file.path(), *negative,
             negative - state.exp_avg_sq.begin());
  return state;
}

bool load_fp8_state(const std::string& checkpoint_dir, Model& model) {
  KILN_CHECK(model.fp8() != nullptr, "load_fp8_state on a model without fp8 products");
  const SafetensorsFile file(checkpoint_dir + "/" + kOptimizerFile);
  if (!file.contains(kFp8StateTensor)) return false;
  const SafetensorsEntry& entry = file.get(kFp8StateTensor);
  const Shape shape = model.fp8()->saved_shape();
  if (entry.shape != shape) return false;  // another amax history length, or the classifier in fp8 or not
  KILN_CHECK(entry.dtype == DType::F32, "{}: tensor '{}' has dtype {}, expected fp32", file.path(), kFp8StateTensor,
             dtype_name(entry.dtype));
  std::vector<float> staging;
  const auto* saved = static_cast<const float*>(aligned_data(entry, staging));
  const std::vector<float> fresh = model.fp8()->saved_state();  // this run's formats in column 3
  const int64_t columns = shape[1];
  for (int64_t row = 0; row < shape[0]; ++row)
    if (saved[row * columns + 3] != fresh[static_cast<size_t>(row * columns + 3)]) return false;  // another format
  for (int64_t row = 0; row < shape[0]; ++row) {
    const float* r = saved + row * columns;
    bool valid = std::isfinite(r[0]) && r[0] > 0 && std::isfinite(r[1]) && r[1] > 0;
    for (int64_t column = 2; column < columns; ++column)
      valid = valid && std::isfinite(r[column]) && r[column] >= 0;
    KILN_CHECK(valid,
               "{}: tensor '{}' is corrupt: row {} holds scale {}, 1/scale {}, amax {} (scales must be finite and "
               "positive, amax values finite and non-negative)",
               file.path(), kFp8StateTensor, row, r[0], r[1], r[2]);
  }
  model.fp8()->load_state({saved, static_cast<size_t>(entry.shape.numel())});
  return true;
}

}  // namespace kiln
