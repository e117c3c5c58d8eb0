// Trainer: owns one training run (ARCHITECTURE.md decision 6). Per iteration:
//   micro-batches (forward, backward; gradients accumulate; with cuda_graph both replayed from a
//   graph, micro_batch_graphs.h) -> global gradient norm and inf/NaN
//   check -> loss-scaler update (skip the step on overflow) -> unscale and clip folded into one
//   factor -> AdamW at the scheduled learning rate -> with fp8, the next fp8 scales.
// global batch = micro-batch x data-parallel size x accumulation steps. Validation, checkpoints
// and logging happen between iterations; observers are told about each event.
//
// Construction validates the whole configuration, opens the data, builds the model on the chosen
// back-end and, with `load`, restores weights, optimizer state, counters and the data position, so
// a resumed run continues exactly where the saved one stopped (bit for bit on the CPU).
// Not thread-safe; observers must outlive the Trainer.
#pragma once

#include <memory>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/op_timing.h"
#include "kiln/data/loader.h"
#include "kiln/data/token_dataset.h"
#include "kiln/data/token_source.h"
#include "kiln/nn/gpt.h"
#include "kiln/obs/observer.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/loss_scaler.h"
#include "kiln/optim/lr_schedule.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/config.h"
#include "kiln/train/micro_batch_graphs.h"

namespace kiln {

// Fills derived fields (including vocab_size from the data's meta.json) and validates; the
// resolved config is what `--print-config` shows and what checkpoints record.
Config resolve_config(Config config);

class Trainer {
 public:
  explicit Trainer(const Config& config);

  void add_observer(TrainObserver* observer) { observers_.push_back(observer); }
  void run();                     // trains until train_iters, validating and saving on schedule
  IterationStats train_step();    // one iteration
  double evaluate();              // mean validation loss over eval_iters micro-batches

  const Config& config() const { return config_; }
  const TrainerState& state() const { return state_; }
  const Gpt& model() const { return *model_; }
  const AdamW& optimizer() const { return *optimizer_; }
  Backend& backend() const { return *backend_; }
  // The per-op timer when the config asks for it (profile_ops), else null.
  OpTimingBackend* op_timing() const { return dynamic_cast<OpTimingBackend*>(backend_.get()); }
  std::string memory_summary() const;
  // The device bytes of memory_summary()'s plan, all allocated before the first step; training
  // allocates nothing more, so the back-end's peak stays within it.
  size_t planned_device_bytes() const;

 private:
  void save();
  void validate(bool at_end);
  // Fails before anything is allocated when the plan cannot fit in the device's free memory.
  void check_memory_fits(const GptConfig& gpt) const;
  // A micro-batch in a stager slot: host copy (checked by the model) and device address.
  struct StagedBatch {
    std::span<int32_t> tokens, targets;
    const int32_t* device = nullptr;
  };
  StagedBatch stage(int64_t first_sample);
  void calibrate_fp8();

  Config config_;
  LrSchedule schedule_;        // parsed once from config_
  bool full_recompute_ = false;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> optimizer_;
  LossScaler scaler_;
  TrainerState state_;
  std::unique_ptr<TokenSource> train_data_, val_data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;  // over train_data_, val_data_
  std::unique_ptr<BatchStager> stager_;  // training micro-batches to the device
  std::unique_ptr<MicroBatchGraphs> graphs_;  // with cuda_graph
  size_t train_shards_ = 0;
  std::vector<TrainObserver*> observers_;
  std::vector<int32_t> tokens_, targets_;
  int64_t last_saved_ = -1, last_validated_ = -1;
  bool fp8_calibrated_ = false;  // this run measured its first fp8 scales (none were loaded)
};

}  // namespace kiln
