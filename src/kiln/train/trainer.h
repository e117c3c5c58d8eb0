// Trainer: owns one training run (ARCHITECTURE.md decision 6) of the model `config.model` names,
// which it knows only as a Model (nn/model.h, train/model_kinds.h). Per iteration:
//   micro-batches (forward, backward; gradients accumulate; with cuda_graph both replayed from a
//   graph, micro_batch_graphs.h) -> global gradient norm and inf/NaN
//   check -> loss-scaler update (skip the step on overflow) -> unscale and clip folded into one
//   factor -> AdamW at the scheduled learning rate -> with fp8, the next fp8 scales.
// global batch = micro-batch x data-parallel size x accumulation steps. Validation, checkpoints
// and logging happen between iterations; observers are told about each event. The parts of a
// step (next micro-batch, forward, backward, the waits, the optimizer) are spans of the step
// trace (core/trace.h), which record only inside --profile's window; with profile the back-end is
// wrapped in a TracingBackend (backend/op_tracing.h), so every op is a span too.
//
// Data parallelism (a Communicator of world size > 1, dist/): every rank holds the whole model and
// optimizer state. Micro-batch k of an iteration on rank r is the global batch's micro-batch
// k x ranks + r (Megatron's slicing: the iteration's samples are the same for any number of ranks,
// and consumed_samples stays the data position). Each rank's backward is scaled by 1 / (micro-
// batches of the global batch); the gradient buckets are summed over the ranks during the last
// micro-batch's backward (dist/gradient_buckets.h), so every rank steps with the same mean
// gradient and makes the same loss-scale, skip and clip decisions. Losses are gathered and summed
// in the global micro-batch order, so the loss is the same bits for any number of ranks.
// Validation splits its micro-batches over the ranks the same way. Only rank 0 writes checkpoints;
// observers are the caller's to attach (the command line attaches them on rank 0 only).
// ZeRO-1 (use_distributed_optimizer): the flat buffers are padded to equal shards, one a rank; the
// gradients are reduce-scattered after the backward, each rank's AdamW keeps and steps its shard
// only, and the parameters are all-gathered (before the next forward, overlap_param_gather). A
// checkpoint gathers the state whole, so any number of ranks resumes from it.
//
// Construction validates the whole configuration, opens the data, builds the model on the chosen
// back-end and, with `load`, restores weights, optimizer state, counters and the data position, so
// a resumed run continues exactly where the saved one stopped (bit for bit on the CPU).
// Not thread-safe; observers must outlive the Trainer.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/op_timing.h"
#include "kiln/backend/op_tracing.h"
#include "kiln/data/loader.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/gradient_buckets.h"
#include "kiln/nn/model.h"
#include "kiln/train/embedding_lookups.h"
#include "kiln/obs/observer.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/loss_scaler.h"
#include "kiln/optim/lr_schedule.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/config.h"
#include "kiln/train/micro_batch_graphs.h"
#include "kiln/train/training_data.h"

namespace kiln {

// Fills derived fields (including vocab_size from the data's meta.json) and validates; the
// resolved config is what `--print-config` shows and what checkpoints record.
// `world_size`: the ranks of the job (data_parallel_size 0 becomes it).
Config resolve_config(Config config, int world_size = 1);

class Trainer {
 public:
  // `communicator`: the data-parallel group, which must outlive the Trainer; its gradients are
  // reduced (in buckets, or reduce-scattered under ZeRO-1) even in a group of one rank. Null: one
  // process alone, which reduces nothing.
  // `device_index`: the GPU to run on with --device cuda (the rank's local rank).
  explicit Trainer(const Config& config, Communicator* communicator = nullptr, int device_index = 0);
  ~Trainer();

  void add_observer(TrainObserver* observer) { observers_.push_back(observer); }
  void run();                     // trains until train_iters, validating and saving on schedule
  IterationStats train_step();    // one iteration
  // Over eval_iters global batches (Megatron's count), or every validation sample once with
  // eval_whole_split: the mean validation loss over the counted targets and, for a model that
  // classifies samples, its accuracy and F1.
  ValidationStats evaluate();

  const Config& config() const { return config_; }
  const TrainerState& state() const { return state_; }
  const Model& model() const { return *model_; }
  const ModelArchitecture& architecture() const { return *architecture_; }
  const AdamW& optimizer() const { return *optimizer_; }
  Backend& backend() const { return *backend_; }
  // The per-op timer when the config asks for it (profile_ops), else null.
  OpTimingBackend* op_timing() const { return dynamic_cast<OpTimingBackend*>(backend_.get()); }
  // The step trace's op recorder when the config asks for this rank's trace (profile and
  // profile_ranks), else null.
  TracingBackend* tracing() const { return dynamic_cast<TracingBackend*>(backend_.get()); }
  std::string memory_summary() const;
  // The device bytes of memory_summary()'s plan, all allocated before the first step; training
  // allocates nothing more, so the back-end's peak stays within it.
  size_t planned_device_bytes() const;

 private:
  void save();
  void validate(bool at_end);
  // Fails before anything is allocated when the plan cannot fit in the device's free memory.
  void check_memory_fits() const;
  // A micro-batch in a stager slot: host copy (checked by the model) and device address.
  struct StagedBatch {
    std::span<int32_t> tokens, targets;
    const int32_t* device = nullptr;
  };
  StagedBatch stage(int64_t first_sample);
  // The buffers the optimizer steps: with ZeRO-1 the padded ones its shard lies in.
  Tensor optimizer_params() const;
  Tensor optimizer_grads() const;
  // Ends the buckets' reduction (every rank's sums, or with ZeRO-1 each shard's at its owner);
  // returns the ms waited.
  double reduce_gradients();
  // Of the whole reduced gradient, on every rank alike.
  double gradient_sum_of_squares();
  // ZeRO-1: every rank's updated shard to every rank; waited now, or by wait_for_parameters()
  // before the parameters are next read (overlap_param_gather).
  void gather_parameters();
  void wait_for_parameters();
  // The whole optimizer state on the host (with ZeRO-1 gathered from every rank: a collective).
  OptimizerSnapshot optimizer_snapshot();
  // Why the run must stop cleanly after this iteration (preemption.h), the same on every rank;
  // empty: go on.
  std::string stop_reason(std::chrono::steady_clock::time_point started) const;
  void calibrate_fp8();
  void update_fp8_scales(int64_t step);

  SingleProcessCommunicator single_process_;
  Communicator& communicator_;  // the caller's, or single_process_
  Config config_;
  LrSchedule schedule_;        // parsed once from config_
  bool full_recompute_ = false;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelArchitecture> architecture_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  LossScaler scaler_;
  TrainerState state_;
  TrainingData data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;  // over data_.train, data_.validation
  std::unique_ptr<BatchStager> stager_;  // training micro-batches to the device
  std::unique_ptr<MicroBatchGraphs> graphs_;  // with cuda_graph
  std::unique_ptr<GradientBuckets> buckets_;  // in a group; with ZeRO-1, reducing to the shards' owners
  std::unique_ptr<EmbeddingLookups> lookups_;  // with buckets_, where deferring the lookup pays
  bool sharded_ = false;                      // ZeRO-1: use_distributed_optimizer on many ranks
  FlatRange shard_;                           // this rank's part of the padded flat buffers
  std::unique_ptr<CommWork> param_gather_;    // the last step's parameter gather, if still in flight
  std::vector<TrainObserver*> observers_;
  std::vector<int32_t> tokens_, targets_;
  int64_t last_saved_ = -1, last_validated_ = -1;
  bool fp8_calibrated_ = false;
  bool starting_afresh_ = false;  // --load is the --save folder, which holds no checkpoint yet  // this run measured its first fp8 scales (none were loaded)
};

}  // namespace kiln
