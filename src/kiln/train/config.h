// Config: the one typed configuration of a training run (ARCHITECTURE.md decision 8).
//
// Filled in three layers: defaults below, then a YAML file (`--config`), then command-line flags.
// Keys use Megatron-LM's argument names: YAML `num_layers` is the flag `--num-layers`. Every
// field is listed once in config_fields(), which drives YAML loading, flag registration and
// `--print-config`, so a field cannot be settable in one place and missing in another.
// Errors (unknown key, wrong type, inconsistent values) are kiln::Errors naming the key and,
// for YAML, the file and line.
//
// Boolean keys are flags (`--fp16`) with a negation (`--no-fp16`).
// Zero means "derive" for: max_position_embeddings (= seq_length), data_parallel_size (= the
// job's world size), global_batch_size (= micro_batch_size x data_parallel_size), lr_decay_iters (= train_iters), vocab_size (from the
// data's meta.json). resolve() fills those in; validate() checks the result.
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/nn/activations.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/gpt_config.h"
#include "kiln/nn/model.h"
#include "kiln/nn/recompute.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/loss_scaler.h"
#include "kiln/storage/storage.h"
#include "kiln/optim/lr_schedule.h"

namespace kiln {

struct Config {
  // Model (train/model_kinds.h): gpt or encoder-classifier, and its shape.
  std::string model = "gpt";
  int64_t num_layers = 4;
  int64_t hidden_size = 128;
  int64_t num_attention_heads = 4;
  int64_t seq_length = 128;
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;
  double init_method_std = 0.02;
  // Megatron's hidden_dropout; -1: the model's default (GPT 0, so today's runs keep their numbers;
  // the encoder classifier 0.1, Megatron's and the lab's), which resolve() fills in.
  double hidden_dropout = -1.0;
  double attention_dropout = -1.0;  // Megatron's attention_dropout; -1: the model's default, as hidden_dropout
  int64_t num_intermediate_layers = 2;  // encoder-classifier: residual Linear+GELU layers after the blocks
  int64_t num_labels = 2;               // encoder-classifier: classes
  std::string text_key = "text";        // raw-text classification data: the text's field
  std::string label_key = "label";      // and the label's
  // Batch.
  int64_t micro_batch_size = 8;
  int64_t global_batch_size = 0;
  int64_t data_parallel_size = 0;  // 0: the job's world size (no tensor or pipeline parallelism)
  int64_t tensor_model_parallel_size = 1;    // Megatron's flag; only 1 (kiln is data-parallel only)
  int64_t pipeline_model_parallel_size = 1;  // Megatron's flag; only 1
  // Optimisation.
  std::string optimizer = "adam";  // Megatron's default and kiln's only one: Adam, decoupled weight decay
  int64_t train_iters = 100;
  double lr = 6e-4;
  double min_lr = 0.0;
  std::string lr_decay_style = "cosine";
  int64_t lr_decay_iters = 0;
  double lr_warmup_fraction = 0.0;
  int64_t lr_warmup_iters = 0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  // Activation recomputation (nn/recompute.h), Megatron's keys; activations_checkpoint_method is
  // the older spelling of recompute_method and implies full granularity.
  std::string recompute_granularity = "none";
  std::string recompute_method;
  int64_t recompute_num_layers = 1;
  std::string activations_checkpoint_method;
  // Mixed precision (the CUDA back-end honours these; the CPU back-end computes in fp32).
  bool fp16 = false;
  bool bf16 = false;
  bool tf32 = false;        // fp32 matrix products on TF32 tensor cores (CUDA only)
  bool fused_attention = true;  // fused attention kernels where they apply (CUDA)
  bool matmul_epilogues = true; // bias/GELU/bias-gradient epilogues in the cuBLASLt products (CUDA)
  bool warpgroup_attention = false;  // the tensor-core attention kernels on wgmma (CUDA, H100/H200)
  bool deterministic_attention = true;  // the tensor-core attention backward bit-reproducible (CUDA)
  bool matmul_autotune = false;  // each product's cuBLASLt algorithm chosen by timing (CUDA)
  bool cudnn_attention = false;  // the fused attention on cuDNN's engines where they take it (CUDA)
  bool profile_ops = false;     // time every back-end op, waiting for the device after each
  // The step trace (obs/step_trace.h): Megatron's --profile, --profile-step-start/-end (the
  // iterations after start up to end are traced) and --profile-ranks; the course's spelling
  // --profile-execution true with --profile-name. Written into profile_dir, else tensorboard_dir.
  bool profile = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::string profile_ranks = "0";  // "0", "0,2", "all"
  std::string profile_dir;
  bool profile_execution = false;  // the same as profile
  std::string profile_name;        // the trace file's name; empty: <host>_<pid>
  bool cuda_graph = false;      // replay each micro-batch's forward and backward from a CUDA graph
  // Megatron's fusion switches (its --no-... flags), accepted and recorded: kiln's CUDA back-end
  // chooses its own fusions (fused_attention, matmul_epilogues above).
  bool masked_softmax_fusion = true;
  bool bias_gelu_fusion = true;
  bool bias_dropout_fusion = true;
  bool gradient_accumulation_fusion = true;
  // fp8 products in the transformer blocks (nn/fp8_scaling.h), Megatron-LM's flags; needs bf16.
  std::string fp8_format;                           // "" (off), hybrid or e4m3
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // or max
  bool fp8_classifier = false;  // the tied classifier's products in fp8 too (Fp8Recipe::classifier)
  bool fp8_fast_accumulation = true;  // the fp8 forward products' cuBLASLt fast accumulation (CUDA)
  int64_t loss_chunk_rows = kDefaultLogitRows;  // positions the classifier and loss take at a time
  double loss_scale = 0.0;  // > 0: static scale; 0: dynamic when fp16
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  // Run.
  std::string device = "cpu";
  int64_t seed = 1234;
  int64_t log_interval = 10;
  int64_t timing_log_level = 0;  // Megatron's timer detail (0-2), recorded
  // TensorBoard event files (obs/tensorboard_observer.h), Megatron's flags and defaults.
  std::string tensorboard_dir;  // empty: none written
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_batch_size_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  // Prometheus endpoint (obs/prometheus_endpoint.h): GET /metrics on metrics_addr, port
  // metrics_port + the rank's local rank; 0: none served.
  int64_t metrics_port = 0;
  std::string metrics_addr = "127.0.0.1";
  int64_t eval_interval = 100;
  int64_t eval_iters = 10;
  // Each validation reads every sample of the validation split once, instead of eval_iters global
  // batches (which must still be > 0: 0 turns validation off). For sources with a fixed set of
  // samples (classification data, one indexed dataset's split: data/token_source.h,
  // distinct_samples).
  bool eval_whole_split = false;
  std::string data_path;
  std::string data_impl = "mmap";  // indexed datasets: mmap (MMIDIDX) or infer (the same to kiln)
  // GPT-2's BPE files (Megatron's --vocab-file and --merge-file: encoder.json and vocab.bpe). kiln
  // trains on token ids, so they are only checked: both or neither, readable, one vocabulary.
  std::string vocab_file;
  std::string merge_file;
  std::string split = "969,30,1";  // train/validation/test documents of indexed datasets
  bool mock_data = false;   // random tokens instead of data_path (benchmarks)
  int64_t num_workers = 2;  // data loader threads (0: read in the training thread)
  int64_t prefetch_factor = 2;
  int64_t data_cache_samples = 0;
  bool pin_memory = true;   // batches staged in page-locked host memory (CUDA)
  bool h2d_stream = true;   // host-to-device copies on their own stream, handed over with events (CUDA)
  std::string data_io = "mmap";     // local files: mmap or pread
  std::string cache_dir;            // local cache of S3 data (an NVMe scratch disk); empty: none
  std::string s3_addressing = "auto";  // auto, path or virtual
  std::string save;
  int64_t save_interval = 0;
  std::string load;
  // Many ranks (dist/): one process per device, placed by torchrun's or Slurm's variables.
  std::string distributed_backend;        // nccl or gloo; empty: nccl on cuda, gloo on cpu
  double distributed_timeout_minutes = 10;  // bounds every wait on another rank
  int64_t ddp_bucket_size = 0;            // gradient elements a bucket; 0: max(40 M, 1 M x ranks)
  bool overlap_grad_reduce = true;        // reduce each bucket while the backward goes on
  std::string ddp_impl = "local";         // Megatron's --DDP-impl: local or torch, both kiln's own buckets
  bool use_distributed_optimizer = false;  // ZeRO-1: each rank keeps and updates a shard of the optimizer state
  bool overlap_param_gather = false;       // the parameters' all-gather waited for just before the next forward
  // Preemption (Megatron's flags): stop cleanly, saving first.
  bool exit_signal_handler = false;  // SIGTERM: finish the step, save, exit 0
  double exit_duration_in_mins = 0;  // > 0: save and stop once the run has lasted this long
  int64_t exit_interval = 0;         // > 0: save and stop at an iteration divisible by it

  // Fills the derived (zero) fields; `world_size` is the number of ranks of the job.
  void resolve(int world_size = 1);
  void validate() const;  // throws naming the first inconsistent key

  int64_t accumulation_steps() const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
  GptConfig gpt() const;
  // No validation at all (benchmarks and the lab): eval_iters 0 and eval_whole_split off.
  void disable_validation() {
    eval_iters = 0;
    eval_whole_split = false;
  }
  double resolved_hidden_dropout() const;     // hidden_dropout, or the model's default where it is -1
  double resolved_attention_dropout() const;  // the same for attention_dropout
  // The model `model` names, before it is built (model_kinds.h).
  std::unique_ptr<ModelArchitecture> architecture() const;
  RecomputePolicy recompute_policy() const;
  LrSchedule lr_schedule() const;
  AdamwConfig adamw() const;
  LossScalerConfig loss_scaler() const;
  std::optional<Fp8Recipe> fp8_recipe() const;  // nullopt: no fp8
  // The size of the vocabulary vocab_file and merge_file hold (largest id + 1), reading and checking
  // both as validate() does; 0 when they are not set.
  int64_t tokenizer_vocab_size() const;
  StorageOptions storage_options() const;
  // distributed_backend, or the device's engine when it is empty.
  std::string resolved_distributed_backend() const {
    return !distributed_backend.empty() ? distributed_backend : device == "cuda" ? "nccl" : "gloo";
  }
  std::chrono::milliseconds distributed_timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(distributed_timeout_minutes * 60'000.0));
  }
  std::string precision_name() const { return fp16 ? "fp16" : bf16 ? "bf16" : tf32 ? "tf32" : "fp32"; }
  // Whether rank `rank` of `world_size` writes a step trace (profile and profile_ranks).
  bool profiles_rank(int64_t rank, int64_t world_size) const;
  // Storage and matmul-input dtype of parameters and activations (TF32 is fp32 storage).
  DType compute_dtype() const { return fp16 ? DType::F16 : bf16 ? DType::BF16 : DType::F32; }
};

using ConfigMember = std::variant<int64_t Config::*, double Config::*, bool Config::*,
                                  std::string Config::*>;

struct ConfigField {
  const char* key;  // YAML key; the flag is "--" + key with '_' -> '-'
  ConfigMember member;
  const char* help;
  const char* flag_alias = nullptr;  // a second spelling of the flag Megatron uses (--DDP-impl), if any
  bool flag_takes_value = false;     // a boolean whose flag takes a value (--profile-execution true)
};

const std::vector<ConfigField>& config_fields();
std::string flag_name(const ConfigField& field);

// Sets one field from text; `origin` ("--lr", "run.yaml:12") prefixes any error.
void set_config_field(Config& config, const ConfigField& field, const std::string& text,
                      const std::string& origin);

// Applies a YAML document (a mapping of keys to scalars) on top of `config`. `source` names the
// document in errors (usually the file path).
void apply_yaml(Config& config, const std::string& yaml_text, const std::string& source);
void apply_yaml_file(Config& config, const std::string& path);

// The configuration as YAML, every field in config_fields() order.
std::string to_yaml(const Config& config);

}  // namespace kiln
