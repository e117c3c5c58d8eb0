// Model: what the Trainer, checkpoints and the memory plan know of a model, so that GPT, the
// encoder classifier (and later a ViT) train through one Trainer. ModelArchitecture is a model
// before it exists: its sizes, FLOPs and memory for a shape, and build(), so a run's plan is
// checked before anything is allocated.
//
// Every model keeps its parameters and fp32 gradients in one flat buffer pair laid out by its
// ParameterLayout (parameters.h, ARCHITECTURE.md decision 3): the optimizer, the gradient
// buckets and the checkpoints see only those buffers and the layout's names.
//
// A training micro-batch is the two int32 rows every TokenSource sample has (data/token_source.h);
// what they mean is the model's (ModelInput). A forward comes in three parts, for a caller that
// records its ops into a graph (Backend::capture): begin_forward() checks the micro-batch on the
// host and copies what is not staged; forward_ops() issues the ops and nothing else; loss() waits
// for them. backward() may come before loss(). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kiln/backend/backend.h"
#include "kiln/core/uncounted_target.h"
#include "kiln/nn/classification_metrics.h"
#include "kiln/nn/dropout_streams.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/parameters.h"
#include "kiln/nn/recompute.h"

namespace kiln {

// What a forward prepares: no backward (evaluation, generation), or a backward whose parameter
// gradients are written over grads() (a step's first micro-batch: no pass zeroes them first) or
// added to them (the micro-batches after it). Either way backward() leaves the same values as
// adding into zeros would (ops.h, GradStore).
enum class GradientPass : uint8_t { None, Write, Add };

// What the two rows of a sample hold.
enum class ModelInput : uint8_t {
  NextTokens,        // input tokens and their next-token targets (GPT)
  LabelledSequences  // input ids, and the label packed with the attention mask (data/classification_tokens.h)
};

// A micro-batch of `batch` samples of `seq` positions: the two rows of each sample, row-major, on
// the host (the model checks them there) and, when staged, the same rows on their way to the
// device (a BatchStager slot, which must stay in place until backward() returns); null: copied.
struct MicroBatch {
  std::span<const int32_t> tokens, targets;  // targets empty: no loss (generation)
  int64_t batch = 0, seq = 0;
  const int32_t* device_tokens = nullptr;
  const int32_t* device_targets = nullptr;
};

// What the ops of forward_ops() and backward() read from begin_forward()'s arguments besides the
// tensors' contents: ops recorded after one begin_forward() replay correctly after another exactly
// when the two give equal ForwardInputs.
struct ForwardInputs {
  const int32_t* tokens = nullptr;   // device addresses the ops read the batch from
  const int32_t* targets = nullptr;  // null without targets
  int64_t batch = 0, seq = 0;
  float gradient_scale = 0.0f;  // loss_scale over what the loss averages (counted positions, samples)
  GradientPass gradients = GradientPass::None;
  DropoutDraw dropout;  // the masks' draw: the seed and stream numbers the dropout ops read
  bool operator==(const ForwardInputs&) const = default;
};

// A tied input embedding (GPT's wte is also its classifier): its gradient has a part known once
// the forward has run and the lookup's part, known only at the very end of backward(). Data
// parallelism reduces the embedding early and adds every rank's lookups afterwards
// (train/embedding_lookups.h). Models without such an embedding have none (Model::tied_embedding).
class TiedEmbedding {
 public:
  virtual ~TiedEmbedding() = default;
  // Called between a training forward and its backward(): leaves the lookup out of that backward,
  // so the embedding's gradients are final now.
  virtual void defer_embedding_lookup() = 0;
  // The gradient at the embedding's output [B, T, C] of the last backward; valid until the next forward.
  virtual Tensor embedding_output_gradient() const = 0;
  // The embedding's gradients += the lookup of `dout` [B, T, C] at `tokens` [B, T] (int32).
  virtual void add_embedding_lookup(const Tensor& dout, const Tensor& tokens) = 0;
  // The end (element offset) of the embedding's gradients in the flat buffer, which start at 0.
  virtual int64_t embedding_gradients_end() const = 0;
  virtual int64_t embedding_width() const = 0;  // C, the embedding's columns
};

class Model {
 public:
  virtual ~Model() = default;

  // Parameters.
  virtual const ParameterLayout& layout() const = 0;
  virtual const FlatParameters& flat() const = 0;
  DType dtype() const { return flat().params.dtype; }
  Tensor params() const { return flat().params; }  // compute dtype
  Tensor grads() const { return flat().grads; }    // fp32
  Tensor padded_params() const { return flat().padded_params; }  // with the flat_multiple padding
  Tensor padded_grads() const { return flat().padded_grads; }
  int64_t num_parameters() const { return layout().total(); }
  // The model's initialisation from `seed`, drawn in fp32 and rounded to dtype().
  virtual void init_weights(uint64_t seed) = 0;
  // Every parameter from fp32 values laid out by layout(), rounded to dtype().
  virtual void set_parameters(std::span<const float> values) = 0;
  // The shape a checkpoint stores a parameter with: its layout shape less any padding rows.
  virtual Shape stored_shape(const ParameterInfo& info) const { return info.shape; }
  // The prefix Hugging Face's files put before this model's names ("transformer." for GPT-2); "" if none.
  virtual std::string_view hugging_face_prefix() const { return ""; }

  // Memory. enable_fp8 before allocate_activations, which reserves the casts' scratch; a model
  // without fp8 products refuses it by name. allocate_activations plans and allocates activation
  // memory once for batches up to max_batch x max_seq under `policy` (recompute.h); the loss runs
  // on `logit_rows` positions at a time where it is chunked.
  virtual void enable_fp8(const Fp8Recipe& recipe) = 0;
  virtual Fp8Scaling* fp8() const { return nullptr; }
  virtual void allocate_activations(int64_t max_batch, int64_t max_seq, const RecomputePolicy& policy,
                                    int64_t logit_rows) = 0;
  virtual size_t activation_bytes() const = 0;
  virtual size_t workspace_bytes() const = 0;

  // A forward in three parts (above). With a `gradients` pass the backward's parameter gradients
  // are d(loss_scale x the mean loss) and a model with dropout drops with the masks `dropout`
  // names (dropout_streams.h); a forward without gradients drops nothing.
  virtual void begin_forward(const MicroBatch& batch, GradientPass gradients = GradientPass::None,
                             float loss_scale = 1.0f, DropoutDraw dropout = {}) = 0;
  virtual void forward_ops() = 0;
  virtual double loss() = 0;  // the mean loss of the last forward; 0 without targets
  // What loss() averages over: the last forward's targets that count (not kUncountedTarget),
  // positions for GPT and samples for a classifier; 0 without targets.
  virtual int64_t counted() const = 0;
  virtual const ForwardInputs& forward_inputs() const = 0;
  // The parameter gradients of the last (training) forward into grads(), written or added as its pass says.
  virtual void backward() = 0;
  double forward(const MicroBatch& batch, GradientPass gradients = GradientPass::None, float loss_scale = 1.0f,
                 DropoutDraw dropout = {}) {
    begin_forward(batch, gradients, loss_scale, dropout);
    forward_ops();
    return loss();
  }
  // Told during backward() each time a suffix of grads() is final for this micro-batch: every
  // gradient at offset >= first_final. Data parallelism starts reducing gradient buckets from it
  // (dist/gradient_buckets.h). The call comes when the ops are issued, not done: what the listener
  // starts must be ordered after the back-end's compute stream. Empty: nobody is told.
  using GradientsFinal = std::function<void(int64_t first_final)>;
  virtual void set_gradients_final_listener(GradientsFinal listener) = 0;

  // Evaluation of a model that classifies samples: the last forward's (label, prediction) pairs
  // of counted labels added to `counts`; other models add nothing. Not after a training forward.
  virtual void count_predictions(ConfusionMatrix& counts) { (void)counts; }
  virtual int64_t num_labels() const { return 0; }  // 0: not a classifier

  // The tied embedding, for models that have one; null otherwise.
  virtual TiedEmbedding* tied_embedding() { return nullptr; }
};

// A model before it is built, from its configuration.
class ModelArchitecture {
 public:
  virtual ~ModelArchitecture() = default;
  virtual ModelInput input() const = 0;
  // One line for the run's log: "GPT: 12 layers, hidden 768, ..." with the parameter count.
  virtual std::string describe() const = 0;
  virtual int64_t num_parameters() const = 0;
  // The closed-form count (perf/flops.h), unpadded vocabulary: `kiln estimate` shows it beside
  // num_parameters().
  virtual double closed_form_parameters() const = 0;
  // Activation bytes allocate_activations(batch, seq, policy, logit_rows) takes, with `fp8` products (null: none).
  virtual size_t activation_bytes(int64_t batch, int64_t seq, const RecomputePolicy& policy, DType dtype,
                                  int64_t logit_rows, const Fp8Recipe* fp8) const = 0;
  // The op scratch the model asks its back-end for at that shape.
  virtual Backend::WorkspaceNeeds workspace_needs(int64_t batch, int64_t seq, DType dtype, const Fp8Recipe* fp8,
                                                  int64_t logit_rows) const = 0;
  // Model FLOPs of a training iteration of `global_batch` samples of `seq` tokens (the recomputed
  // forward counted under full recomputation, Megatron's convention).
  virtual double flops_per_iteration(int64_t global_batch, int64_t seq, bool full_recompute) const = 0;
  // The model on `backend`, its flat buffers padded to a multiple of `flat_multiple` elements.
  virtual std::unique_ptr<Model> build(Backend& backend, DType dtype, int64_t flat_multiple) const = 0;
};

}  // namespace kiln
