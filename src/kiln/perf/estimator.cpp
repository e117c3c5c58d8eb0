#include "kiln/perf/estimator.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/fp8_workspace.h"
#include "kiln/backend/layernorm_workspace.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/perf/flops.h"
#include "kiln/train/model_kinds.h"

namespace kiln {
namespace {

// What a process cannot use of a GPU's nominal memory: the CUDA context, library workspaces and
// allocator slack (78.6 of 80 GiB were free to kiln on an H100 80GB).
constexpr double kReservedGiB = 1.5;

// The model kind `--model` names; an error naming the flag and listing the kinds otherwise.
const ModelKind& model_kind_of(const EstimateInput& in) {
  std::string known;
  for (const ModelKind& kind : model_kinds()) {
    if (kind.name == in.model) return kind;
    known += (known.empty() ? "" : ", ") + std::string(kind.name);
  }
  fail("--model '{}' is not a model kiln builds; choose one of {}", in.model, known);
}

void validate(const EstimateInput& in) {
  // A classifier of labelled sequences (the encoder classifier) is refused what Config::validate
  // refuses it for kiln train, here by the estimate's flags.
  if (model_kind_of(in).input == ModelInput::LabelledSequences) {
    KILN_CHECK(in.num_labels >= 2, "--num-labels must be at least 2, got {}", in.num_labels);
    KILN_CHECK(in.num_intermediate_layers >= 0, "--num-intermediate-layers must be >= 0, got {}",
               in.num_intermediate_layers);
    KILN_CHECK(!in.fp8_classifier,
               "--fp8-classifier: the {} has no tied classifier (its pooler and head stay in the compute dtype); "
               "--fp8-format alone runs its blocks' products in fp8",
               in.model);
  }
  for (auto [value, flag] : {std::pair{in.num_layers, "--num-layers"}, {in.hidden_size, "--hidden-size"},
                             {in.num_attention_heads, "--num-attention-heads"}, {in.seq_length, "--seq-length"},
                             {in.vocab_size, "--vocab-size"}, {in.global_batch_size, "--global-batch-size"},
                             {in.micro_batch_size, "--micro-batch-size"}, {in.gpus, "--gpus"}})
    KILN_CHECK(value > 0, "{} must be positive, got {}", flag, value);
  const std::string oversized = beyond_size_limits(in.num_layers, in.hidden_size, in.num_attention_heads,
                                                   in.vocab_size, in.seq_length, in.micro_batch_size);
  KILN_CHECK(oversized.empty(),
             "--num-layers, --hidden-size, --num-attention-heads, --vocab-size, --seq-length and --micro-batch-size "
             "are too large: {}",
             oversized);
  KILN_CHECK(in.hidden_size % in.num_attention_heads == 0, "--num-attention-heads {} does not divide --hidden-size {}",
             in.num_attention_heads, in.hidden_size);
  KILN_CHECK(in.global_batch_size % in.micro_batch_size == 0 && in.global_batch_size / in.micro_batch_size % in.gpus == 0,
             "--global-batch-size {} is not a multiple of --micro-batch-size {} x --gpus {}", in.global_batch_size,
             in.micro_batch_size, in.gpus);
  KILN_CHECK(in.precision == "fp32" || in.precision == "tf32" || in.precision == "bf16" || in.precision == "fp16",
             "--precision '{}' is not one of fp32, tf32, bf16, fp16", in.precision);
  KILN_CHECK(in.zero_stage >= 0 && in.zero_stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got {}", in.zero_stage);
  KILN_CHECK(!(in.time_per_iteration_s && in.tflops_per_gpu),
             "give one of --time-per-iteration (measured seconds) and --tflops-per-gpu (a target), not both");
  const auto positive_finite = [](double value) { return value > 0 && std::isfinite(value); };
  KILN_CHECK(!in.time_per_iteration_s || positive_finite(*in.time_per_iteration_s),
             "--time-per-iteration must be a positive number, got {}", in.time_per_iteration_s.value_or(0));
  KILN_CHECK(!in.tflops_per_gpu || positive_finite(*in.tflops_per_gpu), "--tflops-per-gpu must be a positive number, got {}",
             in.tflops_per_gpu.value_or(0));
  KILN_CHECK(positive_finite(in.tokens), "--tokens must be a positive number, got {}", in.tokens);
  KILN_CHECK(!in.fp8_classifier || !in.fp8_format.empty(), "--fp8-classifier needs --fp8-format (hybrid or e4m3)");
  KILN_CHECK(in.loss_chunk_rows >= 1 && (!in.fp8_classifier || in.loss_chunk_rows % 16 == 0),
             "--loss-chunk-rows must be >= 1 (a multiple of 16 with --fp8-classifier), got {}", in.loss_chunk_rows);
  if (in.fp8_format.empty()) return;
  KILN_CHECK(in.fp8_format == "hybrid" || in.fp8_format == "e4m3", "--fp8-format '{}' is not hybrid or e4m3",
             in.fp8_format);
  KILN_CHECK(in.precision == "bf16", "--fp8-format needs --precision bf16, not {}", in.precision);
  KILN_CHECK(in.hidden_size % 16 == 0 && in.micro_batch_size * in.seq_length % 16 == 0,
             "--fp8-format needs --hidden-size ({}) and --micro-batch-size x --seq-length ({}) to be multiples of "
             "16 (the fp8 products' dimensions)",
             in.hidden_size, in.micro_batch_size * in.seq_length);
  KILN_CHECK(in.fp8_amax_history_len >= 1, "--fp8-amax-history-len must be >= 1, got {}", in.fp8_amax_history_len);
}

std::string known_gpus() {
  std::string keys;
  for (const GpuSpec& spec : gpu_specs()) keys += (keys.empty() ? "" : ", ") + spec.key;
  return keys;
}

}  // namespace

Config training_config(const EstimateInput& in) {
  Config config;
  config.model = in.model;
  config.num_layers = in.num_layers;
  config.hidden_size = in.hidden_size;
  config.num_attention_heads = in.num_attention_heads;
  config.seq_length = in.seq_length;
  config.vocab_size = in.vocab_size;
  config.num_intermediate_layers = in.num_intermediate_layers;
  config.num_labels = in.num_labels;
  config.global_batch_size = in.global_batch_size;
  config.micro_batch_size = in.micro_batch_size;
  config.bf16 = in.precision == "bf16";
  config.fp16 = in.precision == "fp16";
  config.tf32 = in.precision == "tf32";
  config.device = "cuda";
  config.fp8_format = in.fp8_format;
  config.fp8_amax_history_len = in.fp8_amax_history_len;
  config.fp8_classifier = in.fp8_classifier;
  config.loss_chunk_rows = in.loss_chunk_rows;
  config.deterministic_attention = in.deterministic_attention;
  config.resolve(static_cast<int>(in.gpus));
  return config;
}

MemoryEstimate model_state_bytes(double parameters, const std::string& precision, int zero_stage,
                                 int64_t data_parallel) {
  const bool mixed = precision == "bf16" || precision == "fp16";
  // kiln's buffers: gradients are fp32 in every precision (4). Mixed precision: 2-byte weights,
  // fp32 master + two moments (12). fp32: the weights are the master copy (4), two moments (8).
  const double weight = mixed ? 2 : 4, gradient = 4, optimizer = mixed ? 12 : 8;
  // A sharded buffer is cut into equal shards, padded: ceil(P / Nd) elements a rank (kiln's ZeRO-1
  // pads the flat buffers so; Megatron's distributed optimizer pads its buckets likewise).
  const double shard = std::ceil(parameters / static_cast<double>(data_parallel));
  MemoryEstimate memory;
  memory.weights = zero_stage >= 3 ? shard * weight : parameters * weight;
  memory.gradients = zero_stage >= 2 ? shard * gradient : parameters * gradient;
  memory.optimizer = zero_stage >= 1 ? shard * optimizer : parameters * optimizer;
  return memory;
}

Estimate estimate(const EstimateInput& in) {
  validate(in);
  const auto spec = find_gpu_by_key(in.gpu);
  KILN_CHECK(spec.has_value(), "--gpu '{}' is not known; choose one of {}", in.gpu, known_gpus());
  KILN_CHECK(spec->peak_tflops(in.precision) > 0, "--gpu {} has no {} tensor cores", in.gpu, in.precision);
  KILN_CHECK(in.fp8_format.empty() || spec->peak_tflops("fp8") > 0, "--gpu {} has no fp8 tensor cores", in.gpu);
  Estimate out;
  out.gpu = *spec;
  plan_recompute(in.recompute, in.num_layers);  // validates the policy against the depth
  const Config config = training_config(in);
  const std::shared_ptr<const ModelArchitecture> architecture = config.architecture();
  out.parameters_formula = architecture->closed_form_parameters();
  out.parameters_exact = architecture->num_parameters();

  out.flops_without_recompute = architecture->flops_per_iteration(in.global_batch_size, in.seq_length, false);
  out.flops_with_full_recompute = architecture->flops_per_iteration(in.global_batch_size, in.seq_length, true);
  const bool full = in.recompute.granularity == RecomputeGranularity::Full;
  out.flops_per_iteration = full ? out.flops_with_full_recompute : out.flops_without_recompute;
  const double gpus = static_cast<double>(in.gpus);
  out.has_speed = in.time_per_iteration_s || in.tflops_per_gpu;
  if (in.time_per_iteration_s) {
    out.seconds_per_iteration = *in.time_per_iteration_s;
    out.achieved_tflops_per_gpu = achieved_tflops(out.flops_per_iteration, out.seconds_per_iteration, in.gpus);
  } else if (in.tflops_per_gpu) {
    out.achieved_tflops_per_gpu = *in.tflops_per_gpu;
    out.seconds_per_iteration = out.flops_per_iteration / (gpus * out.achieved_tflops_per_gpu * 1e12);
  }
  if (out.has_speed) {
    out.share_of_peak = out.achieved_tflops_per_gpu / spec->peak_tflops(in.precision);
    const double rate = gpus * out.achieved_tflops_per_gpu * 1e12;  // n X, FLOP/s
    out.days_with_recompute = 8 * in.tokens * out.parameters_formula / rate / 86400;
    out.days_without_recompute = 6 * in.tokens * out.parameters_formula / rate / 86400;
  }

  out.memory = model_state_bytes(static_cast<double>(out.parameters_exact), in.precision, in.zero_stage, in.gpus);
  const DType dtype = config.compute_dtype();
  const std::optional<Fp8Recipe> recipe = config.fp8_recipe();
  const Fp8Recipe* fp8 = recipe ? &*recipe : nullptr;
  const auto activations = [&](int64_t micro) {
    return static_cast<double>(
        architecture->activation_bytes(micro, in.seq_length, in.recompute, dtype, in.loss_chunk_rows, fp8));
  };
  // CudaBackend::workspace_bytes' attention, LayerNorm backward and fp8 cast parts for the model's
  // workspace needs (fused attention on, the default, on a GPU that takes the tiled kernels).
  const auto workspace = [&](int64_t micro) {
    const Backend::WorkspaceNeeds needs =
        architecture->workspace_needs(micro, in.seq_length, dtype, fp8, in.loss_chunk_rows);
    const bool fused = fused_attention_shape(dtype, needs.head_size);
    const bool tiled = fused && tiled_attention_head(needs.head_size);
    const int64_t positions = needs.batch * needs.seq, width = needs.heads * needs.head_size;
    const AttentionFp8Gradient fp8_gradient{fp8 ? 3 * width : 0, fp8 && !tiled};
    const int64_t query_sum_columns = attention_query_sum_columns(tiled, in.deterministic_attention, width);
    const size_t attention = attention_workspace_bytes(needs.batch, needs.heads, needs.seq, dtype, fused,
                                                       fp8_gradient, query_sum_columns);
    const size_t layernorm = layernorm_backward_scratch_bytes(positions, needs.widest_layernorm, fp8 != nullptr);
    const size_t casts = fp8_scratch_bytes(needs.fp8_cast_bytes, positions, needs.widest_row);
    return static_cast<double>(std::max({attention, layernorm, casts}));
  };
  out.memory.activations = activations(in.micro_batch_size);
  out.memory.workspace = workspace(in.micro_batch_size);
  if (fp8) out.memory.fp8_scaling = static_cast<double>(Fp8Scaling::state_bytes(in.num_layers, *recipe));
  const double a = static_cast<double>(in.num_attention_heads), b = static_cast<double>(in.micro_batch_size);
  const double h = static_cast<double>(in.hidden_size), s = static_cast<double>(in.seq_length);
  out.korthikanti_layer_bytes = s * b * h * (34 + 5 * a * s / h);
  out.korthikanti_layer_bytes_full_recompute = 2 * s * b * h;

  const double capacity = (spec->memory_gib - kReservedGiB) * 1073741824.0;
  const double state = out.memory.weights + out.memory.gradients + out.memory.optimizer + out.memory.fp8_scaling;
  auto fits = [&](int64_t micro) { return state + activations(micro) + workspace(micro) <= capacity; };
  int64_t low = 0, high = 1;  // fits(low) holds (or low == 0); find the first high that does not
  while (fits(high) && high < (int64_t{1} << 20)) {
    low = high;
    high *= 2;
  }
  while (high - low > 1) {
    const int64_t middle = (low + high) / 2;
    (fits(middle) ? low : high) = middle;
  }
  out.largest_micro_batch = low;
  out.fits = fits(in.micro_batch_size);

  IterationShape iteration = iteration_shape(config);
  iteration.recompute = in.recompute;
  iteration.optimizer_shards = in.zero_stage >= 1 ? in.gpus : 1;
  out.roofline = roofline(count_iteration_ops(iteration), datasheet_limits(*spec, in.precision));
  out.roofline_tokens_per_second =
      static_cast<double>(in.global_batch_size / in.gpus * in.seq_length) / (out.roofline.ms * 1e-3);
  return out;
}

}  // namespace kiln
