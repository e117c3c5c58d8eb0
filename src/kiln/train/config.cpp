#include "kiln/train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include "kiln/core/error.h"
#include "kiln/train/model_kinds.h"

namespace kiln {

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = {
      {"model", &Config::model,
       "the model: gpt (GPT-2 causal language model) or encoder-classifier (BERT-like sequence classifier, the "
       "seed lab's)"},
      {"num_layers", &Config::num_layers, "transformer blocks"},
      {"hidden_size", &Config::hidden_size, "model width C"},
      {"num_attention_heads", &Config::num_attention_heads, "attention heads (must divide hidden_size)"},
      {"seq_length", &Config::seq_length, "tokens per sample"},
      {"max_position_embeddings", &Config::max_position_embeddings, "position table size (0: seq_length)"},
      {"vocab_size", &Config::vocab_size, "vocabulary size (0: from the data's meta.json)"},
      {"init_method_std", &Config::init_method_std, "std of the normal initialisation"},
      {"hidden_dropout", &Config::hidden_dropout,
       "dropout rate of the embedding's output, each block's two projections and the encoder's intermediate "
       "layers in training (Megatron's; -1: the model's default, 0 for gpt, 0.1 for encoder-classifier)"},
      {"attention_dropout", &Config::attention_dropout,
       "dropout rate of the attention probabilities, inside the attention op, in training (Megatron's; -1: the "
       "model's default, 0 for gpt, 0.1 for encoder-classifier)"},
      {"num_intermediate_layers", &Config::num_intermediate_layers,
       "encoder-classifier: residual Linear+GELU layers between the blocks and the final LayerNorm"},
      {"num_labels", &Config::num_labels, "encoder-classifier: classes (labels 0 .. num_labels-1)"},
      {"text_key", &Config::text_key, "raw-text classification data (.csv, .jsonl): the field holding the text"},
      {"label_key", &Config::label_key, "raw-text classification data: the field holding the integer label"},
      {"micro_batch_size", &Config::micro_batch_size, "samples per forward/backward"},
      {"global_batch_size", &Config::global_batch_size,
       "samples per optimizer step (0: micro x data-parallel); the rest is gradient accumulation"},
      {"data_parallel_size", &Config::data_parallel_size,
       "data-parallel replicas (0: the job's ranks; each rank is one replica)"},
      // Megatron's parallel degrees (default 1, megatron/arguments.py _add_distributed_args): kiln takes 1,
      // so a Megatron command line runs, and names the key when asked for more.
      {"tensor_model_parallel_size", &Config::tensor_model_parallel_size,
       "tensor-parallel degree: 1 only (kiln is data-parallel only; more is an error naming this key)"},
      {"pipeline_model_parallel_size", &Config::pipeline_model_parallel_size,
       "pipeline-parallel degree: 1 only (kiln is data-parallel only; more is an error naming this key)"},
      {"train_iters", &Config::train_iters, "optimizer steps to train"},
      {"lr", &Config::lr, "peak learning rate"},
      {"min_lr", &Config::min_lr, "learning rate at the end of decay"},
      {"lr_decay_style", &Config::lr_decay_style, "constant, linear or cosine"},
      {"lr_decay_iters", &Config::lr_decay_iters, "iterations to decay over (0: train_iters)"},
      {"lr_warmup_fraction", &Config::lr_warmup_fraction, "warm-up as a fraction of lr_decay_iters"},
      {"lr_warmup_iters", &Config::lr_warmup_iters, "warm-up iterations"},
      // Megatron: --optimizer, choices adam and sgd, default adam (AdamW: decoupled weight decay).
      {"optimizer", &Config::optimizer,
       "adam: Adam with decoupled weight decay (AdamW), Megatron's default and kiln's optimizer; Megatron's sgd "
       "is not supported"},
      {"adam_beta1", &Config::adam_beta1, "Adam beta1"},
      {"adam_beta2", &Config::adam_beta2, "Adam beta2"},
      {"adam_eps", &Config::adam_eps, "Adam epsilon"},
      {"weight_decay", &Config::weight_decay, "decoupled weight decay (not on biases, LayerNorm)"},
      {"clip_grad", &Config::clip_grad, "clip the global gradient norm to this (0: off)"},
      {"recompute_granularity", &Config::recompute_granularity, "activation recomputation: none, full, selective"},
      {"recompute_method", &Config::recompute_method, "with full: uniform (chunks of N layers) or block (first N layers)"},
      {"recompute_num_layers", &Config::recompute_num_layers, "N of recompute_method"},
      {"activations_checkpoint_method", &Config::activations_checkpoint_method,
       "older name of recompute_method (implies full granularity)"},
      {"fp16", &Config::fp16, "fp16 mixed precision with loss scaling"},
      {"bf16", &Config::bf16, "bf16 mixed precision"},
      {"tf32", &Config::tf32, "fp32 matrix products on TF32 tensor cores (CUDA)"},
      {"fused_attention", &Config::fused_attention,
       "attention in fused kernels where they apply: CUDA, bf16/fp16, head size up to 256 (tensor cores for "
       "multiples of 8 up to 128 on sm_80+) (--no-fused-attention: T x T scores through cuBLASLt)"},
      {"profile_ops", &Config::profile_ops,
       "time every back-end op, waiting for the device after each (where a step's time goes; slows the step); "
       "kiln train prints the split at the end, kiln bench train after the timed iterations"},
      // Megatron: --profile (off), --profile-step-start (10), --profile-step-end (12), --profile-ranks
      // (0), megatron/training/arguments.py _add_training_args; the course's --profile-execution
      // true and --profile-name.
      {"profile", &Config::profile,
       "write a Chrome trace (Perfetto, chrome://tracing, TensorBoard's profile plugin) of the iterations "
       "after profile_step_start up to profile_step_end: every op, loader and communication thread, CUDA's "
       "kernels and memory (docs/trace.md)"},
      {"profile_step_start", &Config::profile_step_start, "the trace starts after this iteration"},
      {"profile_step_end", &Config::profile_step_end, "the trace ends with this iteration"},
      {"profile_ranks", &Config::profile_ranks, "the ranks that write a trace: 0, a list such as 0,3, or all"},
      {"profile_dir", &Config::profile_dir, "folder of the trace (created); empty: tensorboard_dir"},
      {"profile_execution", &Config::profile_execution, "the same as profile (--profile-execution true)", nullptr,
       true},
      {"profile_name", &Config::profile_name,
       "the trace's file name before .pt.trace.json (with _rank<r> where many ranks run); empty: <host>_<pid>"},
      {"cuda_graph", &Config::cuda_graph,
       "replay each micro-batch's forward and backward from a CUDA graph, recorded once per batch slot and "
       "gradient scale: one launch instead of hundreds (CUDA)"},
      {"fp8_format", &Config::fp8_format,
       "fp8 products in the transformer blocks (needs bf16): hybrid (E4M3 forward, E5M2 gradients) or e4m3; "
       "empty: off"},
      {"fp8_classifier", &Config::fp8_classifier,
       "the tied classifier's products in fp8 too (needs fp8_format; off: bf16, as common fp8 recipes keep the "
       "output head), with 3 more scaled tensors: ln_f's output, wte and the logits' gradient"},
      {"loss_chunk_rows", &Config::loss_chunk_rows,
       "positions the tied classifier and the loss take at a time: the logits (and their gradient) of so many "
       "rows are in memory at once, never the whole micro-batch's; more rows, more memory, fewer and larger "
       "products (a multiple of 16 with fp8_classifier)"},
      {"fp8_margin", &Config::fp8_margin, "fp8 scales are divided by 2^margin"},
      {"fp8_amax_history_len", &Config::fp8_amax_history_len, "steps of amax kept per fp8 tensor"},
      {"fp8_amax_compute_algo", &Config::fp8_amax_compute_algo,
       "fp8 scale from the amax history: most_recent or max"},
      {"fp8_fast_accumulation", &Config::fp8_fast_accumulation,
       "the fp8 forward products accumulate without promoting their partial sums to fp32 at intervals "
       "(cuBLASLt's fast accumulation: faster, less exact; the backward's products always promote, as in "
       "Transformer Engine's and torchao's fp8 recipes) (CUDA; --no-fp8-fast-accumulation: promote there too)"},
      {"matmul_epilogues", &Config::matmul_epilogues,
       "bias, GELU and bias gradients inside the cuBLASLt products where it has algorithms for them (CUDA; "
       "--no-matmul-epilogues: separate kernels)"},
      {"warpgroup_attention", &Config::warpgroup_attention,
       "the tensor-core attention kernels on Hopper's warpgroup products (wgmma) where the GPU and the build "
       "have them: H100/H200, sm_90a (CUDA; off by default: their mma.sync twins, as on sm_80, measured faster "
       "on the H100)"},
      {"deterministic_attention", &Config::deterministic_attention,
       "the tensor-core attention backward in two kernels, each gradient written by one block: the same bits "
       "every run (CUDA; --no-deterministic-attention: one kernel that adds dQ in fp32 atomics, two products "
       "fewer per pair of tiles, FlashAttention-2's backward, rounding that varies from run to run)"},
      {"matmul_autotune", &Config::matmul_autotune,
       "each product shape's cuBLASLt algorithm the fastest of the heuristic's first 8, timed on the product's "
       "own operands at its first call (CUDA; about 32 runs of each shape's product once per run; the "
       "algorithm, and with it the rounding, can differ from run to run); off: the heuristic's first"},
      {"cudnn_attention", &Config::cudnn_attention,
       "the fused attention on cuDNN's flash-attention engines (cuDNN 9, loaded at run time: libcudnn.so.9 or "
       "the file KILN_CUDNN_LIBRARY names) where they take the call: bf16/fp16, heads of up to 128 channels in "
       "multiples of 8, causal or no mask; kiln's own kernels take the rest; cuDNN does not promise the same "
       "bits from run to run (CUDA; off by default: not yet measured against kiln's kernels)"},
      // Megatron's --no-masked-softmax-fusion, --no-bias-gelu-fusion, --no-bias-dropout-fusion and
      // --no-gradient-accumulation-fusion (action store_false: each fusion is on unless turned off).
      {"masked_softmax_fusion", &Config::masked_softmax_fusion,
       "Megatron's fused scale, causal mask and softmax: accepted and recorded, changes nothing (kiln's CUDA "
       "back-end chooses its own fusions; --no-fused-attention is kiln's switch)"},
      {"bias_gelu_fusion", &Config::bias_gelu_fusion,
       "Megatron's fused bias and GELU: accepted and recorded, changes nothing (kiln's CUDA back-end chooses its "
       "own fusions; --no-matmul-epilogues is kiln's switch)"},
      {"bias_dropout_fusion", &Config::bias_dropout_fusion,
       "Megatron's fused bias, dropout and residual add: accepted and recorded, changes nothing (kiln's CUDA "
       "back-end chooses its own fusions)"},
      {"gradient_accumulation_fusion", &Config::gradient_accumulation_fusion,
       "Megatron's weight gradients accumulated inside the products: accepted and recorded, changes nothing "
       "(kiln's CUDA back-end chooses its own fusions)"},
      {"loss_scale", &Config::loss_scale, "static loss scale (0: dynamic under fp16)"},
      {"initial_loss_scale", &Config::initial_loss_scale, "initial dynamic loss scale"},
      {"min_loss_scale", &Config::min_loss_scale, "smallest dynamic loss scale"},
      {"loss_scale_window", &Config::loss_scale_window, "clean iterations before the scale grows"},
      {"hysteresis", &Config::hysteresis, "overflows tolerated before the scale shrinks"},
      {"device", &Config::device, "cpu or cuda"},
      {"seed", &Config::seed, "random seed (initialisation and data order)"},
      {"log_interval", &Config::log_interval, "iterations between log lines"},
      // Megatron: --timing-log-level, int, default 0, choices 0-2 (megatron/training/arguments.py).
      {"timing_log_level", &Config::timing_log_level,
       "Megatron's timer detail, 0, 1 or 2: accepted and recorded; kiln's log line times whole iterations at "
       "every level (--profile-ops times each op)"},
      // Megatron: --tensorboard-dir (default none), --tensorboard-log-interval (1), --tensorboard-queue-size
      // (1000) and the --log-*-to-tensorboard switches (off), megatron/training/arguments.py _add_logging_args.
      {"tensorboard_dir", &Config::tensorboard_dir,
       "folder of TensorBoard event files (created; a resumed run adds a new file); empty: none (docs/tensorboard.md)"},
      {"tensorboard_log_interval", &Config::tensorboard_log_interval,
       "iterations between TensorBoard's training scalars"},
      {"tensorboard_queue_size", &Config::tensorboard_queue_size,
       "TensorBoard events waiting for the writer thread at most; beyond, events are dropped and counted (the "
       "step never waits for the disk)"},
      {"log_timers_to_tensorboard", &Config::log_timers_to_tensorboard,
       "TensorBoard: iteration-time, throughput, batch-generator-time and all-grads-sync-time"},
      {"log_batch_size_to_tensorboard", &Config::log_batch_size_to_tensorboard, "TensorBoard: batch-size"},
      {"log_validation_ppl_to_tensorboard", &Config::log_validation_ppl_to_tensorboard,
       "TensorBoard: lm loss validation ppl"},
      {"log_memory_to_tensorboard", &Config::log_memory_to_tensorboard,
       "TensorBoard: memory; accepted, not recorded yet (the run says so)"},
      {"log_world_size_to_tensorboard", &Config::log_world_size_to_tensorboard, "TensorBoard: world-size"},
      {"metrics_port", &Config::metrics_port,
       "serve Prometheus metrics at http://ADDR:PORT/metrics, each rank on PORT + its local rank; 0: none "
       "(docs/prometheus.md)"},
      {"metrics_addr", &Config::metrics_addr, "address the Prometheus endpoint listens on (0.0.0.0: every interface)"},
      {"eval_interval", &Config::eval_interval, "iterations between validations (0: only at the end)"},
      {"eval_iters", &Config::eval_iters, "batches per validation (0: no validation)"},
      {"eval_whole_split", &Config::eval_whole_split,
       "each validation reads every validation sample exactly once instead of eval_iters batches (classification "
       "data, or one indexed dataset's validation split); the last batch is padded with samples that count for "
       "nothing"},
      {"data_path", &Config::data_path,
       "folder of token shards (train_*.bin, val_*.bin), or Megatron indexed data: PREFIX or '0.3 A 0.7 B'; "
       "local paths or s3://bucket/key"},
      {"split", &Config::split, "train,validation,test weights of indexed datasets' documents"},
      // Megatron: --data-impl, choices lazy, cached, mmap and infer, default infer (megatron/arguments.py,
      // before Megatron kept only mmap). kiln reads the mmap format and checks its header either way.
      {"data_impl", &Config::data_impl,
       "format of indexed datasets: mmap (Megatron's MMIDIDX .bin/.idx, the one kiln reads) or infer (the same: "
       "kiln reads the index header); Megatron's older lazy and cached formats are not supported"},
      // Megatron: --vocab-file and --merge-file, the GPT2BPETokenizer's two files (default none).
      {"vocab_file", &Config::vocab_file,
       "GPT-2's encoder.json (Megatron's gpt2-vocab.json; what kiln data's --tokenizer-dir folder holds): kiln "
       "trains on token ids made beforehand (kiln data), so it only checks that this file and merge_file exist, "
       "are one GPT-2 BPE vocabulary and that its ids fit vocab_size, which still comes from the data"},
      {"merge_file", &Config::merge_file,
       "GPT-2's vocab.bpe, the BPE merges (Megatron's gpt2-merges.txt): checked with vocab_file, needs it"},
      {"num_workers", &Config::num_workers, "data loader threads preparing batches ahead (0: synchronous)"},
      {"prefetch_factor", &Config::prefetch_factor, "batches queued ahead per worker"},
      {"data_cache_samples", &Config::data_cache_samples, "decoded samples kept in an in-memory LRU cache"},
      {"pin_memory", &Config::pin_memory, "stage batches in page-locked host memory (CUDA)"},
      {"h2d_stream", &Config::h2d_stream, "copy batches to the GPU on their own stream, overlapping compute (CUDA)"},
      {"data_io", &Config::data_io, "how local data files are read: mmap or pread"},
      {"cache_dir", &Config::cache_dir, "local folder caching s3:// data on first read (an NVMe scratch disk)"},
      {"s3_addressing", &Config::s3_addressing, "S3 URLs: auto (path-style for AWS_ENDPOINT_URL), path or virtual"},
      {"mock_data", &Config::mock_data, "train on random tokens (needs vocab_size), for benchmarks"},
      {"save", &Config::save, "checkpoint folder"},
      {"save_interval", &Config::save_interval, "iterations between checkpoints (0: only at the end)"},
      {"load", &Config::load, "checkpoint folder to resume from"},
      {"distributed_backend", &Config::distributed_backend,
       "collectives of many ranks: nccl (GPUs) or gloo (CPUs); empty: nccl with --device cuda, gloo with cpu"},
      {"distributed_timeout_minutes", &Config::distributed_timeout_minutes,
       "the longest any rank waits for another (rendezvous, collectives) before the run stops naming the wait"},
      {"ddp_bucket_size", &Config::ddp_bucket_size,
       "gradient elements reduced together, in reverse layer order (0: max(40 M, 1 M x ranks), Megatron's rule; "
       "smaller buckets start sooner in the backward)"},
      {"overlap_grad_reduce", &Config::overlap_grad_reduce,
       "reduce each gradient bucket as soon as the last micro-batch's backward has finished it, hiding the "
       "reduction behind the rest of the backward (--no-overlap-grad-reduce: all of it after the backward)"},
      // Megatron: --DDP-impl, choices local and torch, default local (megatron/arguments.py).
      {"ddp_impl", &Config::ddp_impl,
       "Megatron's DistributedDataParallel implementation (also --DDP-impl): local or torch, both meaning kiln's "
       "own bucketed gradient reduction (ddp_bucket_size, overlap_grad_reduce)",
       "--DDP-impl"},
      {"use_distributed_optimizer", &Config::use_distributed_optimizer,
       "ZeRO-1: gradients are reduce-scattered, each rank keeps the fp32 master weights and Adam moments of its "
       "shard of the flat buffer only, updates it, and the parameters are all-gathered"},
      {"overlap_param_gather", &Config::overlap_param_gather,
       "with use_distributed_optimizer: the parameters' all-gather is waited for only before the next forward "
       "(it overlaps the logging between the steps and the next first micro-batch read, not the forward)"},
      {"exit_signal_handler", &Config::exit_signal_handler,
       "on SIGTERM (Slurm's preemption notice): finish the iteration, save a checkpoint and exit 0"},
      {"exit_duration_in_mins", &Config::exit_duration_in_mins,
       "save and exit 0 once the run has lasted this many minutes (0: never), before a job's time limit"},
      {"exit_interval", &Config::exit_interval, "save and exit 0 at the first iteration divisible by this (0: never)"},
  };
  return fields;
}

std::string flag_name(const ConfigField& field) {
  std::string flag = std::string("--") + field.key;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

namespace {

template <typename T>
T parse_number(const std::string& text, const std::string& origin, const char* key) {
  T value{};
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [ptr, error] = std::from_chars(begin, end, value);
  KILN_CHECK(error == std::errc() && ptr == end && !text.empty(),
             "{}: '{}' expects {}, got '{}'", origin, key,
             std::is_integral_v<T> ? "an integer" : "a number", text);
  if constexpr (std::is_floating_point_v<T>)
    KILN_CHECK(std::isfinite(value), "{}: '{}' must be finite, got '{}'", origin, key, text);
  return value;
}

bool parse_bool(const std::string& text, const std::string& origin, const char* key) {
  if (text == "true" || text == "True" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "False" || text == "0" || text == "no") return false;
  fail("{}: '{}' expects true or false, got '{}'", origin, key, text);
}

std::string read_named_file(const std::string& path, const char* key) {
  KILN_CHECK(std::filesystem::is_regular_file(path), "config key '{}': '{}' {}", key, path,
             std::filesystem::exists(path) ? "is not a file" : "does not exist");
  std::ifstream stream(path, std::ios::binary);
  KILN_CHECK(stream.good(), "config key '{}': cannot open '{}'", key, path);
  std::ostringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

// Checks that vocab_file (encoder.json) and merge_file (vocab.bpe) are one GPT-2 byte-level BPE
// vocabulary, in the format Gpt2Tokenizer reads: an object of token -> id, and an optional
// "#version" line then merges "left right" whose parts and result are all tokens. Returns the
// vocabulary's size (largest id + 1).
int64_t check_gpt2_bpe_files(const std::string& vocab_file, const std::string& merge_file) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_named_file(vocab_file, "vocab_file"));
  } catch (const nlohmann::json::exception& error) {
    fail("config key 'vocab_file': {}: not valid JSON (GPT-2's encoder.json is expected): {}", vocab_file,
         error.what());
  }
  KILN_CHECK(encoder.is_object() && !encoder.empty(),
             "config key 'vocab_file': {}: expected a JSON object of token -> id (GPT-2's encoder.json)", vocab_file);
  std::unordered_set<std::string> tokens;
  int64_t size = 0;
  for (const auto& [token, id] : encoder.items()) {
    KILN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
               "config key 'vocab_file': {}: token '{}' has id {}, not an id >= 0", vocab_file, token, id.dump());
    size = std::max(size, id.get<int64_t>() + 1);
    tokens.insert(token);
  }
  std::istringstream lines(read_named_file(merge_file, "merge_file"));
  int64_t line_number = 0, merges = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    if ((line_number == 1 && line.starts_with("#version")) || line.empty()) continue;
    std::istringstream parts(line);
    std::string left, right, extra;
    parts >> left >> right;
    KILN_CHECK(!left.empty() && !right.empty() && !(parts >> extra),
               "config key 'merge_file': {}:{}: expected a merge of two symbols (GPT-2's vocab.bpe), got '{}'",
               merge_file, line_number, line);
    KILN_CHECK(tokens.contains(left) && tokens.contains(right) && tokens.contains(left + right),
               "config key 'merge_file': {}:{}: merge '{} {}' uses tokens that vocab_file {} does not have (the "
               "two files are not one vocabulary)",
               merge_file, line_number, left, right, vocab_file);
    ++merges;
  }
  KILN_CHECK(merges > 0, "config key 'merge_file': {}: no merges (GPT-2's vocab.bpe is expected)", merge_file);
  return size;
}

}  // namespace

void set_config_field(Config& config, const ConfigField& field, const std::string& text,
                      const std::string& origin) {
  std::visit(
      [&](auto member) {
        using Value = std::remove_cvref_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<Value, int64_t>) {
          config.*member = parse_number<int64_t>(text, origin, field.key);
        } else if constexpr (std::is_same_v<Value, double>) {
          config.*member = parse_number<double>(text, origin, field.key);
        } else if constexpr (std::is_same_v<Value, bool>) {
          config.*member = parse_bool(text, origin, field.key);
        } else {
          config.*member = text;
        }
      },
      field.member);
}

void apply_yaml(Config& config, const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& error) {
    fail("{}:{}:{}: malformed YAML: {}", source, error.mark.line + 1, error.mark.column + 1, error.msg);
  }
  if (root.IsNull()) return;  // an empty file changes nothing
  KILN_CHECK(root.IsMap(), "{}: expected a mapping of config keys, got a {}", source,
             root.IsSequence() ? "list" : "scalar");
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string origin = fmt::format("{}:{}", source, item.first.Mark().line + 1);
    const ConfigField* field = nullptr;
    for (const ConfigField& candidate : config_fields())
      if (key == candidate.key) field = &candidate;
    KILN_CHECK(field != nullptr, "{}: unknown config key '{}'", origin, key);
    KILN_CHECK(item.second.IsScalar(), "{}: '{}' expects a single value, not a {}", origin, key,
               item.second.IsMap() ? "mapping" : item.second.IsSequence() ? "list" : "null");
    set_config_field(config, *field, item.second.Scalar(), origin);
  }
}

void apply_yaml_file(Config& config, const std::string& path) {
  std::ifstream stream(path);
  KILN_CHECK(stream.good(), "cannot open config file '{}'", path);
  std::stringstream contents;
  contents << stream.rdbuf();
  apply_yaml(config, contents.str(), path);
}

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const ConfigField& field : config_fields()) {
    out << YAML::Key << field.key << YAML::Value;
    std::visit(
        [&](auto member) {
          using Value = std::remove_cvref_t<decltype(config.*member)>;
          if constexpr (std::is_same_v<Value, double>) {
            out << fmt::format("{}", config.*member);  // shortest round-trip form
          } else {
            out << config.*member;
          }
        },
        field.member);
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void Config::resolve(int world_size) {
  if (!activations_checkpoint_method.empty()) {
    KILN_CHECK(recompute_method.empty() || recompute_method == activations_checkpoint_method,
               "config keys 'activations_checkpoint_method' ({}) and 'recompute_method' ({}) disagree",
               activations_checkpoint_method, recompute_method);
    recompute_method = activations_checkpoint_method;
    if (recompute_granularity == "none") recompute_granularity = "full";
  }
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  if (data_parallel_size == 0) data_parallel_size = world_size;
  if (global_batch_size == 0) global_batch_size = micro_batch_size * data_parallel_size;
  if (lr_decay_iters == 0) lr_decay_iters = train_iters;
  if (profile_execution) profile = true;
  if (hidden_dropout == -1.0) hidden_dropout = model_kind(model).default_hidden_dropout;
  if (attention_dropout == -1.0) attention_dropout = model_kind(model).default_attention_dropout;
}

void Config::validate() const {
  for (auto [value, key] : {std::pair{num_layers, "num_layers"}, {hidden_size, "hidden_size"},
                            {num_attention_heads, "num_attention_heads"}, {seq_length, "seq_length"},
                            {max_position_embeddings, "max_position_embeddings"},
                            {micro_batch_size, "micro_batch_size"}, {global_batch_size, "global_batch_size"},
                            {data_parallel_size, "data_parallel_size"}, {train_iters, "train_iters"},
                            {lr_decay_iters, "lr_decay_iters"}, {log_interval, "log_interval"},
                            {tensorboard_log_interval, "tensorboard_log_interval"},
                            {tensorboard_queue_size, "tensorboard_queue_size"}})
    KILN_CHECK(value > 0, "config key '{}' must be positive, got {}", key, value);
  KILN_CHECK(vocab_size <= std::numeric_limits<int32_t>::max(),
             "config key 'vocab_size': {} does not fit the int32 token ids", vocab_size);
  const std::string oversized = beyond_size_limits(num_layers, hidden_size, num_attention_heads,
                                                   std::max<int64_t>(vocab_size, 1), seq_length, micro_batch_size);
  KILN_CHECK(oversized.empty(),
             "config keys num_layers, hidden_size, num_attention_heads, vocab_size, seq_length and micro_batch_size "
             "are too large: {}",
             oversized);
  for (const ConfigField& field : config_fields())
    if (const auto* member = std::get_if<double Config::*>(&field.member)) {
      const double value = this->**member;
      KILN_CHECK(std::isfinite(value) && std::fabs(value) <= std::numeric_limits<float>::max(),
                 "config key '{}' must be a finite number within fp32's range, got {}", field.key, value);
    }
  KILN_CHECK(hidden_size % num_attention_heads == 0,
             "config key 'num_attention_heads': {} heads do not divide hidden_size {}",
             num_attention_heads, hidden_size);
  KILN_CHECK(seq_length <= max_position_embeddings,
             "config key 'seq_length': {} exceeds max_position_embeddings {}", seq_length,
             max_position_embeddings);
  KILN_CHECK(vocab_size >= 0, "config key 'vocab_size' must be >= 0, got {}", vocab_size);
  KILN_CHECK(global_batch_size % micro_batch_size == 0 && global_batch_size / micro_batch_size % data_parallel_size == 0,
             "config key 'global_batch_size': {} is not a multiple of micro_batch_size {} x "
             "data_parallel_size {}",
             global_batch_size, micro_batch_size, data_parallel_size);
  KILN_CHECK(lr > 0, "config key 'lr' must be positive, got {}", lr);
  KILN_CHECK(min_lr >= 0 && min_lr <= lr, "config key 'min_lr' must be in [0, lr={}], got {}", lr, min_lr);
  parse_lr_decay_style(lr_decay_style);
  KILN_CHECK(lr_warmup_fraction >= 0 && lr_warmup_fraction <= 1,
             "config key 'lr_warmup_fraction' must be in [0, 1], got {}", lr_warmup_fraction);
  KILN_CHECK(lr_warmup_iters >= 0, "config key 'lr_warmup_iters' must be >= 0, got {}", lr_warmup_iters);
  KILN_CHECK(lr_warmup_fraction == 0 || lr_warmup_iters == 0,
             "config keys 'lr_warmup_fraction' and 'lr_warmup_iters' are both set; use one");
  KILN_CHECK(lr_warmup_iters <= lr_decay_iters,
             "config key 'lr_warmup_iters': {} exceeds lr_decay_iters {}", lr_warmup_iters, lr_decay_iters);
  KILN_CHECK(clip_grad >= 0, "config key 'clip_grad' must be >= 0, got {}", clip_grad);
  KILN_CHECK(!(fp16 && bf16), "config keys 'fp16' and 'bf16' are both set; choose one precision");
  KILN_CHECK(!tf32 || (!fp16 && !bf16), "config key 'tf32' applies to fp32 training, not to fp16/bf16");
  KILN_CHECK(!tf32 || device == "cuda", "config key 'tf32' needs --device cuda (the CPU has no TF32)");
  KILN_CHECK(!matmul_autotune || device == "cuda",
             "config key 'matmul_autotune' needs --device cuda (it chooses among cuBLASLt's algorithms)");
  KILN_CHECK(!cuda_graph || device == "cuda",
             "config key 'cuda_graph' needs --device cuda (the CPU back-end runs each op as it is called)");
  KILN_CHECK(!cuda_graph || !profile_ops,
             "config keys 'cuda_graph' and 'profile_ops' are both set: profiling waits for the device after every "
             "op, which a recorded graph cannot do; choose one");
  if (profile) {
    KILN_CHECK(profile_step_start >= 0 && profile_step_end > profile_step_start,
               "config keys 'profile_step_start' ({}) and 'profile_step_end' ({}): the trace covers the iterations "
               "after the start up to the end, so 0 <= start < end",
               profile_step_start, profile_step_end);
    KILN_CHECK(!profile_ops, "config keys 'profile' and 'profile_ops' are both set: --profile-ops waits for the "
                             "device after every op, which would distort the trace; choose one");
    KILN_CHECK(!cuda_graph, "config keys 'profile' and 'cuda_graph' are both set: a graph's replay issues no op the "
                            "trace could record; trace without --cuda-graph");
    KILN_CHECK(!profile_dir.empty() || !tensorboard_dir.empty(),
               "config key 'profile' needs a folder for the trace: set 'profile_dir' (--profile-dir) or "
               "'tensorboard_dir' (--tensorboard-dir)");
    profiles_rank(0, std::numeric_limits<int64_t>::max());  // checks profile_ranks' syntax
  }
  KILN_CHECK(fp8_format.empty() || fp8_format == "hybrid" || fp8_format == "e4m3",
             "config key 'fp8_format': '{}' is not hybrid or e4m3 (or empty: no fp8)", fp8_format);
  KILN_CHECK(fp8_format.empty() || bf16,
             "config key 'fp8_format' needs bf16 (--bf16): the fp8 products read and write bf16 activations");
  KILN_CHECK(fp8_format.empty() || (hidden_size % 16 == 0 && micro_batch_size * seq_length % 16 == 0),
             "config key 'fp8_format' needs hidden_size ({}) and micro_batch_size x seq_length ({}) to be multiples "
             "of 16 (the fp8 products' dimensions)",
             hidden_size, micro_batch_size * seq_length);
  KILN_CHECK(!fp8_classifier || !fp8_format.empty(),
             "config key 'fp8_classifier' needs fp8_format (--fp8-format hybrid or e4m3): the classifier joins the "
             "blocks' fp8 products");
  KILN_CHECK(loss_chunk_rows >= 1, "config key 'loss_chunk_rows' must be >= 1, got {}", loss_chunk_rows);
  KILN_CHECK(!fp8_classifier || loss_chunk_rows % 16 == 0,
             "config key 'loss_chunk_rows' ({}) must be a multiple of 16 with fp8_classifier (the classifier's fp8 "
             "products' rows)",
             loss_chunk_rows);
  KILN_CHECK(fp8_margin >= 0 && fp8_margin <= 30, "config key 'fp8_margin' must be in [0, 30], got {}", fp8_margin);
  KILN_CHECK(fp8_amax_history_len >= 1, "config key 'fp8_amax_history_len' must be >= 1, got {}",
             fp8_amax_history_len);
  KILN_CHECK(fp8_amax_compute_algo == "most_recent" || fp8_amax_compute_algo == "max",
             "config key 'fp8_amax_compute_algo': '{}' is not most_recent or max", fp8_amax_compute_algo);
  KILN_CHECK(loss_scale >= 0, "config key 'loss_scale' must be >= 0, got {}", loss_scale);
  KILN_CHECK(device == "cpu" || device == "cuda", "config key 'device': '{}' is not cpu or cuda", device);
  KILN_CHECK(eval_interval >= 0, "config key 'eval_interval' must be >= 0, got {}", eval_interval);
  KILN_CHECK(eval_iters >= 0, "config key 'eval_iters' must be >= 0, got {}", eval_iters);
  KILN_CHECK(!eval_whole_split || eval_iters > 0,
             "config key 'eval_whole_split' is set but eval_iters is 0, which turns validation off; set --eval-iters "
             "to any positive number (the whole split replaces its count)");
  KILN_CHECK(save_interval >= 0, "config key 'save_interval' must be >= 0, got {}", save_interval);
  KILN_CHECK(save_interval == 0 || !save.empty(),
             "config key 'save_interval' is set but 'save' (the checkpoint folder) is not");
  KILN_CHECK(seed >= 0, "config key 'seed' must be >= 0, got {}", seed);
  KILN_CHECK(distributed_backend.empty() || distributed_backend == "nccl" || distributed_backend == "gloo",
             "config key 'distributed_backend': '{}' is not nccl or gloo", distributed_backend);
  // One replica may name any backend: Megatron's default nccl runs alone on the CPU too (a launched
  // process of one rank is checked when it joins its group: cli/train.cpp).
  KILN_CHECK(resolved_distributed_backend() != "gloo" || device == "cpu" || data_parallel_size == 1,
             "config key 'distributed_backend' is gloo with --device cuda: gloo reduces host memory; GPU ranks use "
             "nccl");
  KILN_CHECK(resolved_distributed_backend() != "nccl" || device == "cuda" || data_parallel_size == 1,
             "config key 'distributed_backend' is nccl with --device cpu: NCCL reduces GPU memory; CPU ranks use "
             "gloo");
  KILN_CHECK(ddp_impl == "local" || ddp_impl == "torch",
             "config key 'ddp_impl': '{}' is not local or torch (Megatron's choices; both mean kiln's own bucketed "
             "reduction)",
             ddp_impl);
  for (auto [value, key, parallelism] :
       {std::tuple{tensor_model_parallel_size, "tensor_model_parallel_size", "tensor"},
        std::tuple{pipeline_model_parallel_size, "pipeline_model_parallel_size", "pipeline"}}) {
    KILN_CHECK(value > 0, "config key '{}' must be positive, got {}", key, value);
    KILN_CHECK(value == 1, "config key '{}' is {}: {} parallelism is not supported yet (kiln is data-parallel only)",
               key, value, parallelism);
  }
  KILN_CHECK(distributed_timeout_minutes > 0, "config key 'distributed_timeout_minutes' must be positive, got {}",
             distributed_timeout_minutes);
  KILN_CHECK(ddp_bucket_size >= 0, "config key 'ddp_bucket_size' must be >= 0, got {}", ddp_bucket_size);
  KILN_CHECK(!overlap_param_gather || use_distributed_optimizer,
             "config key 'overlap_param_gather' needs use_distributed_optimizer (only ZeRO gathers parameters)");
  KILN_CHECK(exit_duration_in_mins >= 0, "config key 'exit_duration_in_mins' must be >= 0, got {}",
             exit_duration_in_mins);
  KILN_CHECK(exit_interval >= 0, "config key 'exit_interval' must be >= 0, got {}", exit_interval);
  KILN_CHECK(metrics_port >= 0 && metrics_port <= 65535, "config key 'metrics_port' must be in [0, 65535], got {}",
             metrics_port);
  KILN_CHECK(metrics_port == 0 || !metrics_addr.empty(), "config key 'metrics_addr' is empty; give an address such "
             "as 127.0.0.1");
  KILN_CHECK(timing_log_level >= 0 && timing_log_level <= 2, "config key 'timing_log_level' must be 0, 1 or 2, got {}",
             timing_log_level);
  KILN_CHECK(optimizer != "sgd",
             "config key 'optimizer' is sgd: not supported (kiln trains with adam, Adam with decoupled weight decay, "
             "Megatron's default)");
  KILN_CHECK(optimizer == "adam", "config key 'optimizer': '{}' is not adam (Megatron's other choice, sgd, is not "
             "supported)", optimizer);
  KILN_CHECK(data_impl != "lazy" && data_impl != "cached",
             "config key 'data_impl' is {}: Megatron's {} indexed datasets are not supported; kiln reads the mmap "
             "format (MMIDIDX), which Megatron's tools/preprocess_data.py writes by default (--dataset-impl mmap)",
             data_impl, data_impl);
  KILN_CHECK(data_impl == "mmap" || data_impl == "infer", "config key 'data_impl': '{}' is not mmap or infer",
             data_impl);
  if (const int64_t tokens = tokenizer_vocab_size(); tokens > 0) {
    KILN_CHECK(vocab_size == 0 || tokens <= vocab_size,
               "config key 'vocab_file': {} has ids up to {}, beyond vocab_size {} (the model could not embed them)",
               vocab_file, tokens - 1, vocab_size);
  }
  KILN_CHECK(num_workers >= 0 && num_workers <= 256, "config key 'num_workers' must be in [0, 256], got {}", num_workers);
  KILN_CHECK(prefetch_factor > 0, "config key 'prefetch_factor' must be positive, got {}", prefetch_factor);
  KILN_CHECK(data_cache_samples >= 0, "config key 'data_cache_samples' must be >= 0, got {}", data_cache_samples);
  storage_options();  // data_io and s3_addressing name their key when malformed
  KILN_CHECK(adam_beta1 >= 0 && adam_beta1 < 1, "config key 'adam_beta1' must be in [0, 1), got {}", adam_beta1);
  KILN_CHECK(adam_beta2 >= 0 && adam_beta2 < 1, "config key 'adam_beta2' must be in [0, 1), got {}", adam_beta2);
  KILN_CHECK(adam_eps > 0, "config key 'adam_eps' must be positive, got {}", adam_eps);
  KILN_CHECK(weight_decay >= 0, "config key 'weight_decay' must be >= 0, got {}", weight_decay);
  KILN_CHECK(initial_loss_scale > 0, "config key 'initial_loss_scale' must be positive, got {}",
             initial_loss_scale);
  KILN_CHECK(min_loss_scale > 0, "config key 'min_loss_scale' must be positive, got {}", min_loss_scale);
  KILN_CHECK(loss_scale_window > 0, "config key 'loss_scale_window' must be positive, got {}",
             loss_scale_window);
  KILN_CHECK(hysteresis > 0, "config key 'hysteresis' must be positive, got {}", hysteresis);
  KILN_CHECK(init_method_std > 0, "config key 'init_method_std' must be positive, got {}", init_method_std);
  KILN_CHECK(hidden_dropout >= 0 && hidden_dropout < 1, "config key 'hidden_dropout' must be in [0, 1), got {}",
             hidden_dropout);
  KILN_CHECK(attention_dropout >= 0 && attention_dropout < 1,
             "config key 'attention_dropout' must be in [0, 1), got {}", attention_dropout);
  KILN_CHECK(attention_dropout == 0 || !cuda_graph,
             "config keys 'attention_dropout' and 'cuda_graph' are both set: every micro-batch draws new dropout "
             "masks, which a graph's replay would repeat");
  KILN_CHECK(hidden_dropout == 0 || !cuda_graph,
             "config keys 'hidden_dropout' and 'cuda_graph' are both set: every micro-batch draws new dropout masks, "
             "which a graph's replay would repeat");
  plan_recompute(recompute_policy(), num_layers);
  const ModelKind& kind = model_kind(model);
  if (kind.input == ModelInput::LabelledSequences) {
    KILN_CHECK(num_labels >= 2, "config key 'num_labels' must be at least 2, got {}", num_labels);
    KILN_CHECK(num_intermediate_layers >= 0, "config key 'num_intermediate_layers' must be >= 0, got {}",
               num_intermediate_layers);
    KILN_CHECK(!text_key.empty() && !label_key.empty(), "config keys 'text_key' and 'label_key' must not be empty");
    KILN_CHECK(!fp8_classifier,
               "config key 'fp8_classifier' is set, but the {} has no tied classifier (its pooler and head stay in the "
               "compute dtype); fp8_format alone runs its blocks' products in fp8",
               model);
  }
}

double Config::resolved_hidden_dropout() const {
  return hidden_dropout == -1.0 ? model_kind(model).default_hidden_dropout : hidden_dropout;
}

double Config::resolved_attention_dropout() const {
  return attention_dropout == -1.0 ? model_kind(model).default_attention_dropout : attention_dropout;
}

std::unique_ptr<ModelArchitecture> Config::architecture() const { return model_kind(model).architecture(*this); }

int64_t Config::tokenizer_vocab_size() const {
  KILN_CHECK(vocab_file.empty() == merge_file.empty(),
             "config keys 'vocab_file' and 'merge_file' go together (GPT-2's BPE needs both), but only '{}' is set",
             vocab_file.empty() ? "merge_file" : "vocab_file");
  return vocab_file.empty() ? 0 : check_gpt2_bpe_files(vocab_file, merge_file);
}

RecomputePolicy Config::recompute_policy() const {
  return RecomputePolicy::parse(recompute_granularity, recompute_method, recompute_num_layers);
}

GptConfig Config::gpt() const {
  GptConfig gpt;
  gpt.num_layers = num_layers;
  gpt.hidden_size = hidden_size;
  gpt.num_heads = num_attention_heads;
  gpt.vocab_size = vocab_size > 0 ? vocab_size : 1;
  gpt.max_position_embeddings = max_position_embeddings;
  gpt.init_method_std = static_cast<float>(init_method_std);
  gpt.hidden_dropout = static_cast<float>(resolved_hidden_dropout());
  gpt.attention_dropout = static_cast<float>(resolved_attention_dropout());
  return gpt;
}

LrSchedule Config::lr_schedule() const {
  LrSchedule schedule;
  schedule.max_lr = static_cast<float>(lr);
  schedule.min_lr = static_cast<float>(min_lr);
  schedule.decay_iters = lr_decay_iters;
  schedule.warmup_iters = lr_warmup_iters > 0
                              ? lr_warmup_iters
                              : static_cast<int64_t>(lr_warmup_fraction * static_cast<double>(lr_decay_iters));
  schedule.style = parse_lr_decay_style(lr_decay_style);
  return schedule;
}

AdamwConfig Config::adamw() const {
  return {static_cast<float>(adam_beta1), static_cast<float>(adam_beta2), static_cast<float>(adam_eps),
          static_cast<float>(weight_decay)};
}

std::optional<Fp8Recipe> Config::fp8_recipe() const {
  if (fp8_format.empty()) return std::nullopt;
  Fp8Recipe recipe;
  recipe.grad_dtype = fp8_format == "hybrid" ? DType::F8E5M2 : DType::F8E4M3;
  recipe.margin = static_cast<int>(fp8_margin);
  recipe.amax_history = fp8_amax_history_len;
  recipe.use_history_max = fp8_amax_compute_algo == "max";
  recipe.classifier = fp8_classifier;
  return recipe;
}

LossScalerConfig Config::loss_scaler() const {
  LossScalerConfig scaler;
  scaler.dynamic = fp16 && loss_scale == 0;
  scaler.initial_scale = !fp16 ? 1.0f : loss_scale > 0 ? static_cast<float>(loss_scale)
                                                       : static_cast<float>(initial_loss_scale);
  scaler.min_scale = static_cast<float>(min_loss_scale);
  scaler.growth_interval = loss_scale_window;
  scaler.hysteresis = hysteresis;
  return scaler;
}

StorageOptions Config::storage_options() const {
  StorageOptions options;
  options.local_io = parse_local_io(data_io);
  options.cache_dir = cache_dir;
  try {
    options.s3_addressing = parse_s3_addressing(s3_addressing);
  } catch (const Error& error) {
    fail("config key 's3_addressing': {}", error.what());
  }
  return options;
}

bool Config::profiles_rank(int64_t rank, int64_t world_size) const {
  if (!profile) return false;
  if (profile_ranks == "all") return true;
  KILN_CHECK(!profile_ranks.empty() && profile_ranks.back() != ',',
             "config key 'profile_ranks': '{}' is not a list of ranks such as 0 or 0,3, or all", profile_ranks);
  bool listed = false;
  std::stringstream list(profile_ranks);
  for (std::string item; std::getline(list, item, ',');) {
    int64_t listed_rank = -1;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), listed_rank);
    KILN_CHECK(error == std::errc() && end == item.data() + item.size() && listed_rank >= 0,
               "config key 'profile_ranks': '{}' is not a list of ranks such as 0 or 0,3, or all", profile_ranks);
    KILN_CHECK(listed_rank < world_size,
               "config key 'profile_ranks' names rank {}, but the job has {} ranks", listed_rank, world_size);
    listed = listed || listed_rank == rank;
  }
  return listed;
}

}  // namespace kiln
