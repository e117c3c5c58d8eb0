// Checkpoints: a folder per saved iteration, Megatron-style, readable by other tools.
//
//   SAVE/latest_checkpointed_iteration.txt   the newest complete iteration (Megatron's tracker)
//   SAVE/iter_0000100/model.safetensors      weights under the model's names (Hugging Face
//                                            GPT-2's; the encoder's BERT-like ones), Linear
//                                            weights [in, out], the word embeddings trimmed to
//                                            vocab_size rows (Model::stored_shape)
//   SAVE/iter_0000100/optimizer.safetensors  Adam moments "exp_avg.<name>", "exp_avg_sq.<name>"
//                                            (the fp32 master weights are the model weights,
//                                            also when training keeps bf16/fp16 parameters);
//                                            with fp8, "fp8_scaling": the scales and amax
//                                            histories (nn/fp8_scaling.h)
//   SAVE/iter_0000100/trainer_state.json     iteration, consumed samples, optimizer steps,
//                                            counters, loss-scaler state, data order, config
//
// Saving is atomic: everything goes to a temporary folder that is renamed into place, and only
// then is the tracker rewritten (atomically); a crash mid-save leaves the previous checkpoint
// intact and pointed to. Loading validates every tensor's name, dtype and shape against the model
// and names the file and tensor on a mismatch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/nn/model.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/loss_scaler.h"
#include "kiln/train/config.h"

namespace kiln {

struct TrainerState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;  // also the data order position: sample indices used so far
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
  int64_t optimizer_steps = 0;
  LossScalerState loss_scaler;
  // Read back only: the ranks of the run that wrote the checkpoint (trainer_state.json's
  // distributed.world_size; 1 in checkpoints from before many ranks). save_checkpoint takes it as
  // an argument instead.
  int64_t saved_by_ranks = 1;
};

// The optimizer state as a checkpoint holds it: whole flat fp32 vectors in layout order, one
// element a parameter, whatever the number of ranks or shards that kept it (the fp32 master
// weights are also the model file's weights). So a run saved by 4 ranks resumes on 2 or 1.
struct OptimizerSnapshot {
  std::vector<float> master, exp_avg, exp_avg_sq;
};

// Writes SAVE/iter_XXXXXXX and updates the tracker; returns the checkpoint folder.
// `world_size` and `sharded` are recorded in trainer_state.json (what wrote it, not a constraint).
std::string save_checkpoint(const std::string& save_dir, const Config& config, const Model& model,
                            const OptimizerSnapshot& optimizer, const TrainerState& state, int world_size,
                            bool sharded);

// Whether `dir` holds a checkpoint resolve_checkpoint_dir can find (the model file or a tracker).
bool holds_checkpoint(const std::string& dir);

// The checkpoint folder `load` refers to: `load` itself when it holds model.safetensors, else the
// iteration named by its tracker file.
std::string resolve_checkpoint_dir(const std::string& load);

Config read_checkpoint_config(const std::string& checkpoint_dir);
TrainerState read_trainer_state(const std::string& checkpoint_dir);
// The model's parameters from model.safetensors, rounded to the model's dtype; returns them as
// read, in fp32 (the master weights load_optimizer_state wants, so the file is read once).
std::vector<float> load_model_weights(const std::string& checkpoint_dir, Model& model);
// Adam moments, with the fp32 master weights load_model_weights returned (exact, not re-widened
// from rounded parameters), so a bf16/fp16 run resumes bit for bit.
OptimizerSnapshot read_optimizer_state(const std::string& checkpoint_dir, std::vector<float> master_weights,
                                       const Model& model);

// The fp8 scaling state of a model with fp8 products (Model::enable_fp8) from optimizer.safetensors;
// false, loading nothing, when the checkpoint has none or one of another amax history length or
// fp8 format, or with the classifier's rows where this model has none or none where it has them;
// an error naming the file when its values cannot be scales and amax.
bool load_fp8_state(const std::string& checkpoint_dir, Model& model);

}  // namespace kiln
