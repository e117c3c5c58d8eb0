#include "kiln/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "kiln/backend/op_timing.h"
#include "kiln/backend/op_tracing.h"
#include "kiln/core/trace.h"
#include "kiln/backend/registry.h"
#include "kiln/core/error.h"
#include "kiln/perf/flops.h"
#include "kiln/train/model_kinds.h"
#include "kiln/train/preemption.h"

namespace kiln {
namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

Config resolve_config(Config config, int world_size) {
  config.resolve(world_size);
  if (config.vocab_size == 0) config.vocab_size = data_vocab_size(config, model_kind(config.model).input);
  config.validate();
  return config;
}

Trainer::Trainer(const Config& config, Communicator* communicator, int device_index)
    : communicator_(communicator ? *communicator : single_process_),
      config_(resolve_config(config, communicator_.world_size())),
      schedule_(config_.lr_schedule()),
      full_recompute_(config_.recompute_policy().granularity == RecomputeGranularity::Full) {
  trace::name_this_thread("trainer");  // the step trace's track of the thread that trains
  const int ranks = communicator_.world_size();
  KILN_CHECK(config_.data_parallel_size == ranks,
             "config key 'data_parallel_size' is {} but the job has {} rank(s) (tensor and pipeline parallelism "
             "are 1: every rank is a data-parallel replica); leave it 0 to take the job's size",
             config_.data_parallel_size, ranks);
  backend_ = make_backend(config_.device,
                          BackendOptions{config_.tf32, config_.fused_attention, config_.matmul_epilogues,
                                         config_.warpgroup_attention, config_.deterministic_attention,
                                         config_.matmul_autotune, config_.fp8_fast_accumulation,
                                         config_.cudnn_attention, device_index});
  if (config_.profile_ops) backend_ = std::make_unique<OpTimingBackend>(std::move(backend_));
  if (config_.profiles_rank(communicator_.rank(), communicator_.world_size()))
    backend_ = std::make_unique<TracingBackend>(std::move(backend_));
  architecture_ = config_.architecture();
  data_ = open_training_data(config_, architecture_->input());
  LoaderOptions loader{static_cast<int>(config_.num_workers), static_cast<int>(config_.prefetch_factor),
                       config_.data_cache_samples, communicator_.rank(), ranks, "train loader"};
  train_loader_ = std::make_unique<DataLoader>(*data_.train, config_.micro_batch_size, loader);
  loader.name = "validation loader";
  if (data_.validation)
    val_loader_ = std::make_unique<DataLoader>(*data_.validation, config_.micro_batch_size, loader);
  check_memory_fits();
  // A joined group, even of one rank, reduces its gradients; a process alone has nothing to reduce.
  const bool grouped = communicator != nullptr;
  // ZeRO-1 cuts the flat buffers into equal shards, one a rank: padded to a multiple of the ranks.
  sharded_ = grouped && config_.use_distributed_optimizer;
  model_ = architecture_->build(*backend_, config_.compute_dtype(), sharded_ ? ranks : 1);
  if (sharded_) {
    const int64_t shard = model_->padded_params().numel() / ranks, first = shard * communicator_.rank();
    shard_ = FlatRange{first, first + shard};
  }
  if (const auto recipe = config_.fp8_recipe()) model_->enable_fp8(*recipe);
  model_->allocate_activations(config_.micro_batch_size, config_.seq_length, config_.recompute_policy(),
                               config_.loss_chunk_rows);
  StagerOptions staging;
  staging.ints_per_batch = 2 * static_cast<size_t>(config_.micro_batch_size * config_.seq_length);
  staging.pinned = config_.pin_memory;
  staging.own_stream = config_.h2d_stream;
  stager_ = backend_->make_batch_stager(staging);
  if (config_.cuda_graph) graphs_ = std::make_unique<MicroBatchGraphs>(*backend_);
  if (grouped) {
    std::vector<int64_t> starts;
    for (const ParameterInfo& entry : model_->layout().entries()) starts.push_back(entry.offset);
    // A tied embedding's gradient in a bucket of its own, reduced during the blocks' backward
    // (embedding_lookups.h); not from CUDA graphs, whose replayed backward adds the lookup itself,
    // nor to ZeRO-1's owners.
    int64_t embedding_end = 0;
    const TiedEmbedding* tied = model_->tied_embedding();
    if (tied && !sharded_ && !config_.cuda_graph &&
        EmbeddingLookups::worthwhile(*tied, config_.micro_batch_size, config_.seq_length, config_.compute_dtype(),
                                     ranks)) {
      embedding_end = tied->embedding_gradients_end();
      lookups_ = std::make_unique<EmbeddingLookups>(*backend_, communicator_, config_.micro_batch_size,
                                                    config_.seq_length, tied->embedding_width(),
                                                    config_.compute_dtype());
    }
    // ZeRO-1: the padded buffer, each bucket's pieces reduced to the ranks that own them.
    buckets_ = std::make_unique<GradientBuckets>(
        communicator_, optimizer_grads(), starts,
        config_.ddp_bucket_size > 0 ? config_.ddp_bucket_size : default_bucket_elements(ranks), embedding_end,
        sharded_ ? shard_.count() : 0);
  }
  scaler_ = LossScaler(config_.loss_scaler());
  // --load naming the --save folder before its first checkpoint starts afresh (Megatron's rule),
  // so a job restarted by its launcher resumes with the same command; any other --load must hold one.
  starting_afresh_ = !config_.load.empty() && config_.load == config_.save && !holds_checkpoint(config_.load);
  if (config_.load.empty() || starting_afresh_) {
    model_->init_weights(static_cast<uint64_t>(config_.seed));
    // Mixed precision: the master copy starts as the (rounded) initial parameters, as in Megatron.
    optimizer_ = std::make_unique<AdamW>(*backend_, model_->layout(), optimizer_params(), config_.adamw(), shard_);
  } else {
    // The files hold whole tensors: any number of ranks resumes from them, each taking its shard.
    const std::string dir = resolve_checkpoint_dir(config_.load);
    state_ = read_trainer_state(dir);  // first: it says whether the optimizer file's layout is one to read
    std::vector<float> master_weights = load_model_weights(dir, *model_);
    optimizer_ = std::make_unique<AdamW>(*backend_, model_->layout(), optimizer_params(), config_.adamw(), shard_);
    const OptimizerSnapshot saved = read_optimizer_state(dir, std::move(master_weights), *model_);
    optimizer_->load_state(saved.master, saved.exp_avg, saved.exp_avg_sq);
    // Megatron's slices start every rank at consumed / ranks, on a micro-batch boundary: a data
    // position that does not fall on one would skip or repeat samples.
    const int64_t slice = config_.micro_batch_size * ranks;
    KILN_CHECK(state_.consumed_samples % slice == 0,
               "'{}' stopped at {} consumed samples, which micro-batches of {} on {} rank(s) ({} samples) do not "
               "divide: the data position cannot continue exactly; resume with a micro-batch size and number of "
               "ranks whose product divides {}",
               dir, state_.consumed_samples, config_.micro_batch_size, ranks, slice, state_.consumed_samples);
    optimizer_->set_steps_taken(state_.optimizer_steps);
    if (config_.fp16) scaler_.set_state(state_.loss_scaler);
    last_saved_ = state_.iteration;
    if (model_->fp8() && load_fp8_state(dir, *model_)) return;
  }
  if (model_->fp8()) calibrate_fp8();
}

// The amax of every fp8 tensor from a forward and backward of each micro-batch of the next global
// batch (this rank's slice of it; the ranks' amax are then agreed), so that the first step casts
// with scales from the data rather than 1 (the delayed-scaling recipe has no history yet), and the
// scales do not depend on how many ranks share the batch. The gradients are discarded (the step's
// first micro-batch writes over them).
void Trainer::calibrate_fp8() {
  const int64_t micro = config_.micro_batch_size, first_local = state_.consumed_samples / communicator_.world_size();
  for (int64_t step = 0; step < config_.accumulation_steps(); ++step) {
    train_loader_->next(first_local + step * micro, tokens_, targets_);
    model_->forward(MicroBatch{tokens_, targets_, micro, config_.seq_length}, GradientPass::Write);
    model_->backward();
  }
  update_fp8_scales(state_.iteration);
  fp8_calibrated_ = true;
}

// Every rank casts with the same scales, from the largest amax any rank saw (Transformer Engine
// reduces the amax over the data-parallel group the same way). The state's other columns (scales,
// fp8 maxima, histories) are already the same on every rank, so its maximum over the ranks is
// taken whole: one small reduction, the amax column agreed.
void Trainer::update_fp8_scales(int64_t step) {
  communicator_.all_reduce(model_->fp8()->state(), ReduceOp::Max)->wait();
  model_->fp8()->update_scales(step);
}

void Trainer::check_memory_fits() const {
  const std::optional<Backend::DeviceMemory> memory = backend_->device_memory();
  if (!memory) return;
  const size_t free_bytes = memory->free;
  const DType dtype = config_.compute_dtype();
  const auto count = static_cast<size_t>(architecture_->num_parameters());
  const size_t parameter_bytes = count * dtype_size(dtype);
  const size_t fp32_bytes = count * sizeof(float);  // gradients, each Adam moment, the master copy
  const size_t optimizer_bytes = (dtype == DType::F32 ? 2 : 3) * fp32_bytes;
  const std::optional<Fp8Recipe> fp8 = config_.fp8_recipe();
  const Fp8Recipe* recipe = fp8 ? &*fp8 : nullptr;
  const size_t activation_bytes =
      architecture_->activation_bytes(config_.micro_batch_size, config_.seq_length, config_.recompute_policy(), dtype,
                                      config_.loss_chunk_rows, recipe);
  const size_t workspace_bytes = backend_->workspace_bytes(architecture_->workspace_needs(
      config_.micro_batch_size, config_.seq_length, dtype, recipe, config_.loss_chunk_rows));
  const size_t total = parameter_bytes + fp32_bytes + optimizer_bytes + activation_bytes + workspace_bytes;
  constexpr double kGiB = 1073741824.0;
  KILN_CHECK(total <= free_bytes,
             "not enough memory on {}: parameters {:.2f} GiB ({}) + gradients {:.2f} GiB + optimizer state {:.2f} GiB "
             "(Adam moments{}) + activations {:.2f} GiB (micro-batch {} x sequence {}) + op workspace {:.2f} GiB "
             "= {:.2f} GiB, but {:.2f} GiB are free; lower --micro-batch-size (activations and workspace scale "
             "with it) and raise accumulation through --global-batch-size",
             backend_->description(), parameter_bytes / kGiB, dtype_name(dtype), fp32_bytes / kGiB,
             optimizer_bytes / kGiB, dtype == DType::F32 ? "" : " and fp32 master weights", activation_bytes / kGiB,
             config_.micro_batch_size, config_.seq_length, workspace_bytes / kGiB, total / kGiB, free_bytes / kGiB);
}

size_t Trainer::planned_device_bytes() const {
  return model_->padded_params().bytes() + model_->padded_grads().bytes() + optimizer_->master_bytes() +
         optimizer_->state_bytes() +
         model_->activation_bytes() + model_->workspace_bytes() + stager_->device_bytes() +
         (model_->fp8() ? model_->fp8()->bytes() : 0);
}

std::string Trainer::memory_summary() const {
  const size_t param_bytes = model_->padded_params().bytes();
  const size_t moment_bytes = optimizer_->state_bytes() / 2;
  const size_t master_bytes = optimizer_->master_bytes();
  const size_t total = planned_device_bytes();
  std::string table = fmt::format("memory plan on {} (allocated once, before the first step):\n", backend_->description());
  const auto row = [&](const char* category, double bytes, const std::string& note) {
    table += fmt::format("  {:<22}{:>12.2f} MiB  {}\n", category, mib(static_cast<size_t>(bytes)), note);
  };
  const std::string dtype(dtype_name(model_->dtype()));
  const std::string shard =
      sharded_ ? fmt::format("; this rank's shard, 1/{} (ZeRO-1)", communicator_.world_size()) : "";
  row("parameters", param_bytes, master_bytes ? dtype : dtype + "; also the master weights");
  if (master_bytes) row("master weights", master_bytes, "fp32, in the optimizer" + shard);
  row("gradients", model_->padded_grads().bytes(), "fp32");
  row("Adam first moment", moment_bytes, "fp32" + shard);
  row("Adam second moment", moment_bytes, "fp32" + shard);
  row("activations", model_->activation_bytes(),
      dtype + "; recompute: " + config_.recompute_policy().describe());
  row("workspace", model_->workspace_bytes(), model_->fp8() ? "op scratch, fp8 casts included" : "op scratch");
  if (model_->fp8()) row("fp8 scaling", model_->fp8()->bytes(), "scales and amax histories");
  if (stager_->device_bytes() > 0) row("batch slots", stager_->device_bytes(), "2 micro-batches in flight");
  row("total on the device", total, "");
  row("data buffers (host)", stager_->host_bytes(),
      backend_->device() == Device::CPU ? "2 micro-batch slots"
      : config_.pin_memory              ? "2 micro-batch slots, page-locked"
                                        : "2 micro-batch slots, pageable");
  table.pop_back();
  return table;
}

Tensor Trainer::optimizer_params() const { return sharded_ ? model_->padded_params() : model_->params(); }
Tensor Trainer::optimizer_grads() const { return sharded_ ? model_->padded_grads() : model_->grads(); }

double Trainer::reduce_gradients() {
  if (!buckets_) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  buckets_->finish();
  if (lookups_) lookups_->add_to(*model_->tied_embedding());  // waits for the gathered lookups first
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double Trainer::gradient_sum_of_squares() {
  if (!sharded_) return backend_->sum_of_squares({model_->grads()});
  // Each rank holds the reduced gradients of its shard only (the padding is zero).
  std::vector<double> sum{backend_->sum_of_squares({model_->padded_grads().slice(shard_.begin, shard_.count())})};
  communicator_.all_reduce_host(sum, ReduceOp::Sum);
  return sum[0];
}

void Trainer::gather_parameters() {
  param_gather_ = communicator_.all_gather(model_->padded_params());
  if (!config_.overlap_param_gather) wait_for_parameters();
}

void Trainer::wait_for_parameters() {
  if (!param_gather_) return;
  const trace::Span span("communication", "parameter gather (wait)");
  std::exchange(param_gather_, nullptr)->wait();
}

OptimizerSnapshot Trainer::optimizer_snapshot() {
  const auto count = static_cast<size_t>(model_->num_parameters());
  // The shard's values; with ZeRO-1 every rank's, gathered in a scratch buffer of the whole.
  const auto whole = [&](const Tensor& shard) {
    std::vector<float> host(static_cast<size_t>(sharded_ ? model_->padded_params().numel() : shard.numel()));
    backend_->copy_to_host(host.data() + (sharded_ ? shard_.begin : 0), shard.data, shard.bytes());
    if (sharded_) {
      const std::unique_ptr<DeviceBuffer> scratch = backend_->allocate(host.size() * sizeof(float));
      backend_->copy_to_device(scratch->data(), host.data(), scratch->bytes());
      const Tensor gathered{scratch->data(), Shape{static_cast<int64_t>(host.size())}, DType::F32, backend_->device()};
      communicator_.all_gather(gathered)->wait();
      backend_->copy_to_host(host.data(), scratch->data(), scratch->bytes());
    }
    host.resize(count);
    return host;
  };
  return {whole(optimizer_->master()), whole(optimizer_->exp_avg()), whole(optimizer_->exp_avg_sq())};
}

IterationStats Trainer::train_step() {
  const auto start = std::chrono::steady_clock::now();
  const trace::Span step_span("step", trace::recording() ? fmt::format("iteration {}", state_.iteration + 1) : "");
  const int64_t micro = config_.micro_batch_size, seq = config_.seq_length;
  const int64_t accumulation = config_.accumulation_steps();
  const int ranks = communicator_.world_size();
  const int64_t micro_batches = accumulation * ranks;  // of the global batch
  const float scale = scaler_.scale();
  std::vector<double> losses(static_cast<size_t>(micro_batches), 0.0);
  // This rank's samples are numbered locally: its micro-batch k starts at local sample
  // consumed / ranks + k x micro (the loader maps them to the global batch's slices).
  const int64_t first_local = state_.consumed_samples / ranks;
  // Micro-batch k+1 is read and its copy queued before micro-batch k is computed, so the copy
  // overlaps the compute (batch_stager.h).
  StagedBatch current = stage(first_local);
  wait_for_parameters();  // ZeRO-1's gather, left running (overlap_param_gather), before the forward reads them
  for (int64_t step = 0; step < accumulation; ++step) {
    const bool last = step + 1 == accumulation;
    const StagedBatch next = !last ? stage(first_local + (step + 1) * micro) : StagedBatch{};
    const std::string micro_batch = trace::recording() ? fmt::format(" (micro-batch {})", step + 1) : "";
    std::optional<trace::Span> phase;  // the step trace's part of the micro-batch under way
    phase.emplace("phase", "forward" + micro_batch);
    stager_->wait_for_copy(current.device);
    const MicroBatch batch{current.tokens, current.targets, micro, seq, current.device,
                           current.device + current.tokens.size()};
    // The first micro-batch writes the gradients (no pass zeroes them), the others add to them.
    model_->begin_forward(batch, step == 0 ? GradientPass::Write : GradientPass::Add,
                          scale / static_cast<float>(micro_batches),
                          DropoutDraw{static_cast<uint64_t>(config_.seed), state_.iteration,
                                      step * ranks + communicator_.rank()});
    // The last backward starts each gradient bucket as soon as it is final (not from a graph,
    // whose replay tells nobody).
    const bool overlap = last && buckets_ && config_.overlap_grad_reduce && !graphs_;
    const bool defer_lookup = last && lookups_;  // lookups_ only without graphs
    if (overlap) model_->set_gradients_final_listener([this](int64_t first) { buckets_->gradients_final_from(first); });
    if (graphs_) {
      graphs_->forward_backward(*model_);
    } else {
      model_->forward_ops();
      phase.emplace("phase", "backward" + micro_batch);
      if (defer_lookup) {
        model_->tied_embedding()->defer_embedding_lookup();
        if (overlap) buckets_->start_early();  // the embedding's gradient is final now
      }
      model_->backward();
    }
    if (overlap) model_->set_gradients_final_listener({});
    if (defer_lookup) lookups_->start(*model_->tied_embedding(), current.tokens);
    // Waits for the device once per micro-batch, with backward queued.
    phase.emplace("sync", "loss (waits for the device)");
    losses[static_cast<size_t>(step * ranks + communicator_.rank())] = model_->loss();
    phase.reset();
    stager_->release(current.device);
    current = next;
  }
  const double reduce_wait_ms = [&] {
    const trace::Span span("communication", "gradient reduction (wait)");
    return reduce_gradients();
  }();
  std::vector<double> reduce_waits;  // every rank's, in rank order
  const double lm_loss = [&] {
    const trace::Span span("communication", "loss and reduce waits (over ranks)");
    // One all-reduce: the micro-batches' losses, then each rank's wait in its own slot.
    losses.resize(static_cast<size_t>(micro_batches + ranks), 0.0);
    losses[static_cast<size_t>(micro_batches + communicator_.rank())] = reduce_wait_ms;
    communicator_.all_reduce_host(losses, ReduceOp::Sum);  // x + 0 is x: each slot exact
    reduce_waits.assign(losses.begin() + micro_batches, losses.end());
    double sum = 0.0;  // in the global micro-batch order: the same bits for any number of ranks
    for (int64_t k = 0; k < micro_batches; ++k) sum += losses[static_cast<size_t>(k)];
    return sum / static_cast<double>(micro_batches);
  }();
  const double grad_norm = [&] {
    const trace::Span span("optimizer", "gradient norm");
    return std::sqrt(gradient_sum_of_squares()) / scale;
  }();
  const bool skip = scaler_.update(!std::isfinite(grad_norm));

  const int64_t iteration = state_.iteration + 1;
  const float lr = schedule_.at(iteration);
  if (!skip) {
    const trace::Span span("optimizer", "optimizer step");
    const float clip = clip_coefficient(grad_norm, static_cast<float>(config_.clip_grad));
    optimizer_->step(optimizer_grads(), lr, clip / scale);
    if (sharded_) gather_parameters();
  }
  if (model_->fp8()) {
    const trace::Span span("fp8", "fp8 scales");
    update_fp8_scales(iteration);  // skipped steps too, as Transformer Engine
  }
  state_.iteration = iteration;
  state_.consumed_samples += config_.global_batch_size;
  state_.optimizer_steps = optimizer_->steps_taken();
  state_.skipped_iterations += skip;
  state_.nan_iterations += !std::isfinite(lm_loss);
  state_.loss_scaler = scaler_.state();
  {
    const trace::Span span("sync", "synchronize");
    backend_->synchronize();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  IterationStats stats;
  stats.iteration = iteration;
  stats.train_iters = config_.train_iters;
  stats.consumed_samples = state_.consumed_samples;
  stats.elapsed_ms = seconds * 1e3;
  stats.data_wait_ms = train_loader_->take_wait_ms();
  stats.grad_reduce_wait_ms = reduce_wait_ms;
  if (ranks > 1) stats.grad_reduce_wait_ms_by_rank = std::move(reduce_waits);
  stats.data_parallel_size = ranks;
  // Megatron counts the recomputed forward in the achieved rate: the 96 (not 72) form under full.
  stats.tflops_per_gpu =
      achieved_tflops(architecture_->flops_per_iteration(config_.global_batch_size, seq, full_recompute_), seconds,
                      config_.data_parallel_size);
  stats.tokens_per_second = static_cast<double>(config_.global_batch_size * seq) / seconds;
  stats.learning_rate = lr;
  stats.global_batch_size = config_.global_batch_size;
  stats.lm_loss = lm_loss;
  stats.loss_scale = scale;
  stats.grad_norm = grad_norm;
  stats.skipped_iterations = state_.skipped_iterations;
  stats.nan_iterations = state_.nan_iterations;
  stats.skipped = skip;
  stats.memory_allocated_bytes = static_cast<int64_t>(backend_->allocated_bytes());
  stats.memory_max_allocated_bytes = static_cast<int64_t>(backend_->peak_allocated_bytes());
  if (const auto device = backend_->device_memory())
    stats.device_memory_used_bytes = static_cast<int64_t>(device->total - device->free);
  return stats;
}

Trainer::StagedBatch Trainer::stage(int64_t first_sample) {
  const trace::Span span("data", "next micro-batch");
  const std::span<int32_t> slot = stager_->next_host_slot();
  const size_t half = slot.size() / 2;
  StagedBatch batch{slot.first(half), slot.subspan(half), nullptr};
  train_loader_->next_into(first_sample, batch.tokens, batch.targets);
  batch.device = stager_->submit();
  return batch;
}

ValidationStats Trainer::evaluate() {
  KILN_CHECK(val_loader_ != nullptr, "validation needs eval_iters > 0 and validation data");
  wait_for_parameters();
  const int64_t micro = config_.micro_batch_size;
  const int ranks = communicator_.world_size(), rank = communicator_.rank();
  // Validation casts with the training scales but must not add its amax to the next step's, so
  // that a run with other validation points (a resumed one) casts exactly as this one.
  std::vector<char> fp8_state;
  if (model_->fp8()) {
    fp8_state.resize(model_->fp8()->state().bytes());
    backend_->copy_to_host(fp8_state.data(), model_->fp8()->state().data, fp8_state.size());
  }
  // eval_iters global batches, as Megatron counts them, or the whole split's samples, once: either
  // way the samples do not depend on the number of ranks. Rank r evaluates micro-batches r,
  // r + ranks, ...: its local batch b is the global micro-batch b x ranks + r, of global samples
  // from (b x ranks + r) x micro on. Samples past the whole split pad the last micro-batch and
  // count for nothing.
  const int64_t samples = config_.eval_whole_split ? *data_.validation->distinct_samples()
                                                   : config_.eval_iters * config_.global_batch_size;
  const int64_t micro_batches = (samples + micro - 1) / micro, seq = config_.seq_length;
  // Micro-batch b's loss sum in slot 2b and its count in 2b + 1, written by the rank that ran it
  // and 0 on the others, so summing over the ranks is exact (x + 0 is x) and then over the slots in
  // global order gives the same bits for any number of ranks.
  std::vector<double> sums(2 * static_cast<size_t>(micro_batches), 0.0);
  ConfusionMatrix predictions(model_->num_labels());
  for (int64_t batch = rank, local = 0; batch < micro_batches; batch += ranks, ++local) {
    val_loader_->next(local * micro, tokens_, targets_);
    const std::span<int32_t> targets(targets_);
    for (int64_t row = samples - batch * micro; row < micro; ++row)
      data_.validation->mark_uncounted(targets.subspan(static_cast<size_t>(row * seq), static_cast<size_t>(seq)));
    const double loss = model_->forward(MicroBatch{tokens_, targets_, micro, seq});
    const auto count = static_cast<double>(model_->counted());
    sums[2 * static_cast<size_t>(batch)] = loss * count;
    sums[2 * static_cast<size_t>(batch) + 1] = count;
    model_->count_predictions(predictions);
  }
  if (model_->fp8()) backend_->copy_to_device(model_->fp8()->state().data, fp8_state.data(), fp8_state.size());
  ValidationStats stats;
  stats.iteration = state_.iteration;
  // One all-reduce for the ranks' sums and their confusion counts (integers: exact in doubles).
  std::vector<double>& confusion = predictions.counts();
  sums.insert(sums.end(), confusion.begin(), confusion.end());
  communicator_.all_reduce_host(sums, ReduceOp::Sum);
  std::copy(sums.end() - static_cast<std::ptrdiff_t>(confusion.size()), sums.end(), confusion.begin());
  double loss_sum = 0.0, counted = 0.0;
  for (int64_t batch = 0; batch < micro_batches; ++batch) {
    loss_sum += sums[2 * static_cast<size_t>(batch)];
    counted += sums[2 * static_cast<size_t>(batch) + 1];
  }
  stats.lm_loss = counted > 0 ? loss_sum / counted : 0.0;
  stats.perplexity = std::exp(stats.lm_loss);
  if (model_->num_labels() > 0) {
    stats.classification = ClassificationScores{predictions.accuracy(), predictions.f1(),
                                                static_cast<int64_t>(predictions.total())};
  }
  return stats;
}

void Trainer::validate(bool at_end) {
  ValidationStats stats = evaluate();
  stats.at_end = at_end;
  last_validated_ = state_.iteration;
  for (TrainObserver* observer : observers_) observer->on_validation(stats);
}

void Trainer::save() {
  last_saved_ = state_.iteration;
  wait_for_parameters();
  const OptimizerSnapshot optimizer = optimizer_snapshot();  // with ZeRO-1, every rank takes part
  if (communicator_.rank() != 0) return;  // rank 0 alone writes
  const std::string dir = save_checkpoint(config_.save, config_, *model_, optimizer, state_,
                                          communicator_.world_size(), sharded_);
  for (TrainObserver* observer : observers_) observer->on_checkpoint(state_.iteration, dir);
}

void Trainer::run() {
  for (TrainObserver* observer : observers_) {
    observer->on_message(fmt::format("model: {}; sequence {}", architecture_->describe(), config_.seq_length));
    observer->on_message(fmt::format(
        "batch: micro {} x data-parallel {} x accumulation {} = global {} | precision {} | data: {}",
        config_.micro_batch_size, config_.data_parallel_size, config_.accumulation_steps(),
        config_.global_batch_size, config_.precision_name(), data_.description));
    observer->on_message(memory_summary());
    if (starting_afresh_)
      observer->on_message(fmt::format("no checkpoint in '{}' yet: starting from scratch (--load is the --save folder)",
                                       config_.load));
    if (state_.iteration > 0)
      observer->on_message(fmt::format("resumed from '{}' at iteration {} ({} samples consumed, saved by {} rank{})",
                                       config_.load, state_.iteration, state_.consumed_samples,
                                       state_.saved_by_ranks, state_.saved_by_ranks == 1 ? "" : "s"));
    if (model_->fp8())
      observer->on_message(fmt::format(
          "fp8: {} products of the transformer blocks{} (E4M3 forward{}, {} gradients), delayed scaling over {} "
          "step(s) of amax ({}), margin {}; {}",
          4 * config_.num_layers, config_.fp8_classifier ? " and the classifier's" : "",
          config_.fp8_fast_accumulation && config_.device == "cuda" ? " with fast accumulation" : "",
          config_.fp8_format == "hybrid" ? "E5M2" : "E4M3", config_.fp8_amax_history_len,
          config_.fp8_amax_compute_algo, config_.fp8_margin,
          fp8_calibrated_ ? "scales calibrated on one micro-batch before the first step"
                          : "scales restored from the checkpoint"));
  }
  const auto started = std::chrono::steady_clock::now();
  while (state_.iteration < config_.train_iters) {
    for (TrainObserver* observer : observers_) observer->on_iteration_begin(state_.iteration + 1);
    const IterationStats stats = train_step();
    for (TrainObserver* observer : observers_) observer->on_iteration(stats);
    const int64_t it = state_.iteration;
    if (val_loader_ && config_.eval_interval > 0 && it % config_.eval_interval == 0) validate(false);
    if (!config_.save.empty() && config_.save_interval > 0 && it % config_.save_interval == 0) save();
    if (const std::string reason = stop_reason(started); !reason.empty()) {
      if (!config_.save.empty() && last_saved_ != state_.iteration) save();
      wait_for_parameters();
      for (TrainObserver* observer : observers_)
        observer->on_message(fmt::format("exiting at iteration {}: {}", state_.iteration, reason));
      return;
    }
  }
  if (val_loader_ && last_validated_ != state_.iteration) validate(true);
  if (!config_.save.empty() && last_saved_ != state_.iteration) save();
  wait_for_parameters();
}

std::string Trainer::stop_reason(std::chrono::steady_clock::time_point started) const {
  if (config_.exit_interval > 0 && state_.iteration % config_.exit_interval == 0)
    return fmt::format("--exit-interval {} reached", config_.exit_interval);
  if (!config_.exit_signal_handler && config_.exit_duration_in_mins <= 0) return {};
  // Every rank must stop at the same iteration: one that received the signal or ran out of time
  // tells the others (Megatron's all-reduce of the flags, by maximum).
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() / 60.0;
  std::vector<double> flags{config_.exit_signal_handler && termination_signal_received() ? 1.0 : 0.0,
                            config_.exit_duration_in_mins > 0 && minutes > config_.exit_duration_in_mins ? 1.0 : 0.0};
  communicator_.all_reduce_host(flags, ReduceOp::Max);
  if (flags[0] > 0) return "SIGTERM received (--exit-signal-handler): saved, exiting cleanly";
  if (flags[1] > 0) return fmt::format("--exit-duration-in-mins {} reached", config_.exit_duration_in_mins);
  return {};
}

Trainer::~Trainer() {
  // A gather still in flight writes into the model's parameters: let it finish (or fail) first.
  try {
    wait_for_parameters();
  } catch (const std::exception&) {  // the run is over either way; its own error is the one to report
  }
}

}  // namespace kiln
