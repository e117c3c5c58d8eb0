// GPT: a GPT-2 causal language model (pre-LayerNorm blocks, learned positions, tied input and
// output embeddings, biases, GELU) with explicit forward and backward on any Backend.
//
// Ownership: Gpt owns its flat parameter and gradient buffers and its activation arena, all in
// the back-end's memory; the optimizer owns master weights and moments (optim/adamw.h). Views
// returned by params()/grads() stay valid for the model's lifetime.
// Precision: parameters and activations are kept in the compute dtype given at construction
// (fp32, or bf16/fp16 for mixed precision); gradients are always fp32 (ops.h). enable_fp8() casts
// the blocks' products (and, as its recipe says, the classifier's) to fp8 on top of bf16/fp16.
// Gradients start at zero; each training forward says whether its backward writes or adds them
// (GradientPass), so a training step needs no pass that zeroes them.
// Memory: allocate_activations(B, T) sizes the arena once; forward() with any b <= B, t <= T
// re-lays the views inside it, so steady-state training never allocates.
// Not thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "kiln/backend/backend.h"
#include "kiln/core/arena.h"
#include "kiln/nn/activations.h"
#include "kiln/nn/block.h"
#include "kiln/nn/block_stack.h"
#include "kiln/nn/dropout_streams.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/gpt_config.h"
#include "kiln/nn/model.h"
#include "kiln/nn/parameters.h"
#include "kiln/nn/recompute.h"

namespace kiln {

// Inputs already on the device for Gpt::forward (a BatchStager slot); null: copy from the host.
struct GptStagedInputs {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};

class Gpt final : public Model, public TiedEmbedding {
 public:
  // `flat_multiple`: the flat parameter and gradient buffers are allocated rounded up to a
  // multiple of this many elements (the ZeRO shards' equal split); the padding is zero and belongs
  // to no parameter.
  Gpt(const GptConfig& config, Backend& backend, DType dtype = DType::F32, int64_t flat_multiple = 1);

  const GptConfig& config() const { return config_; }
  const ParameterLayout& layout() const override { return layout_; }
  const FlatParameters& flat() const override { return flat_; }

  // GPT-2 initialisation from `seed`: N(0, std) for matrices and embeddings, residual output
  // projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 * layers), zero biases, unit
  // LayerNorm gains, zero padding rows in wte. Values are drawn in fp32, then rounded to dtype().
  void init_weights(uint64_t seed) override;
  void set_parameters(std::span<const float> values) override;
  // wte without its padding rows.
  Shape stored_shape(const ParameterInfo& info) const override;
  std::string_view hugging_face_prefix() const override { return "transformer."; }

  // fp8 products in the transformer blocks, and in the classifier where the recipe says so, from
  // now on (fp8_scaling.h; bf16/fp16 models). Call
  // before allocate_activations, which reserves the casts' scratch. fp8() is null without it.
  void enable_fp8(const Fp8Recipe& recipe) override;
  Fp8Scaling* fp8() const override { return fp8_.get(); }

  // Plans and allocates activation memory once, for batches up to max_batch x max_seq, keeping
  // or recomputing block activations as `policy` says (recompute.h); the classifier and loss run
  // on `logit_rows` positions at a time.
  void allocate_activations(int64_t max_batch, int64_t max_seq, const RecomputePolicy& policy = {},
                            int64_t logit_rows = kDefaultLogitRows) override;
  size_t activation_bytes() const override { return arena_ ? arena_->capacity() : 0; }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  // The op scratch a model of this shape asks its back-end for (allocate_activations reserves it),
  // with fp8 products as `fp8` says (null: none) and the classifier on `logit_rows` positions at a time.
  static Backend::WorkspaceNeeds workspace_needs(const GptConfig& config, int64_t batch, int64_t seq, DType dtype,
                                                 const Fp8Recipe* fp8 = nullptr,
                                                 int64_t logit_rows = kDefaultLogitRows);

  // Runs the model on tokens [batch * seq] (host, row-major). With targets, returns the mean
  // loss over counted positions (target != ignore_index). The classifier and loss run in chunks
  // of logit rows, so the logits of the whole batch never exist at once; with a `gradients` pass
  // each chunk's d(loss_scale * sum of losses)/d logits is turned into d ln_f at once, and the
  // classifier's part of the wte gradient goes into grads() (written or added, as the pass says)
  // already here; backward() does the rest. Without targets returns 0 and forms no logits
  // (logits_at() forms one position's).
  // `staged`: the same tokens and targets already on their way to the device (a BatchStager
  // slot; the host copies are still checked), used instead of copying; they must stay in place
  // until backward() returns.
  // With config().hidden_dropout > 0 a training forward (a `gradients` pass) drops the embedding's
  // output and each block's two projections (block.h) with the masks `dropout` names
  // (dropout_streams.h); its backward and any recomputation draw them again. A forward without
  // gradients drops nothing.
  double forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t batch,
                 int64_t seq, GradientPass gradients = GradientPass::None, float loss_scale = 1.0f,
                 GptStagedInputs staged = {}, DropoutDraw dropout = {});
  using Model::forward;

  // forward() in three parts (model.h): MicroBatch's rows are the tokens and their targets.
  void begin_forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                     int64_t batch, int64_t seq, GradientPass gradients = GradientPass::None,
                     float loss_scale = 1.0f, GptStagedInputs staged = {}, DropoutDraw dropout = {});
  void begin_forward(const MicroBatch& batch, GradientPass gradients = GradientPass::None, float loss_scale = 1.0f,
                     DropoutDraw dropout = {}) override;
  void forward_ops() override;
  double loss() override;
  int64_t counted() const override { return counted_; }
  const ForwardInputs& forward_inputs() const override { return inputs_; }
  // The rest of this micro-batch's parameter gradients into grads(), written or added as the
  // forward's `gradients` pass says; requires that forward just before it.
  void backward() override;
  // The listener (model.h) hears ln_f's gradients, then each block's from the last, then all.
  void set_gradients_final_listener(GradientsFinal listener) override { gradients_final_ = std::move(listener); }

  // The tied embedding's gradient, early (data parallelism: Trainer). wte's gradient has two parts:
  // the classifier's, complete once the forward has run (its backward runs there), and the token
  // lookup's, known only at the very end of backward(). Called between a training forward and its
  // backward(), this leaves the lookup out of that backward: wte's and wpe's gradients are then
  // final now (wpe's written as zeros on a writing pass), so they can be reduced while the blocks'
  // backward runs; the listener is told nothing below the first block. The caller adds the lookups
  // afterwards, each rank's, with add_embedding_lookup(embedding_output_gradient(), tokens).
  void defer_embedding_lookup() override;
  // The gradient at the embedding's output [B, T, C] of the last backward (the lookup's input);
  // valid until the next forward.
  Tensor embedding_output_gradient() const override;
  // wte's token rows and wpe's rows += the lookup of `dout` [B, T, C] at `tokens` [B, T] (int32):
  // the part defer_embedding_lookup() left out, for any rank's micro-batch.
  void add_embedding_lookup(const Tensor& dout, const Tensor& tokens) override;
  int64_t embedding_gradients_end() const override;  // wte's and wpe's
  int64_t embedding_width() const override { return config_.hidden_size; }
  TiedEmbedding* tied_embedding() override { return this; }

  // Logits of one position of the last forward (formed now from its final LayerNorm output, in
  // the compute dtype also where the classifier is fp8: one row is no fp8 product's shape), first
  // vocab_size columns, copied to the host.
  std::vector<float> logits_at(int64_t batch_index, int64_t position);
  int32_t ignore_index() const { return kUncountedTarget; }

 private:
  GptConfig config_;
  Backend& backend_;
  ParameterLayout layout_;
  FlatParameters flat_;
  GptWeights weights_, weight_grads_;
  std::unique_ptr<DeviceBuffer> activation_buffer_;
  std::unique_ptr<Arena> arena_;  // borrows activation_buffer_
  int64_t max_batch_ = 0, max_seq_ = 0;
  RecomputePolicy recompute_;
  int64_t logit_rows_ = kDefaultLogitRows;
  size_t workspace_bytes_ = 0;
  GptActivations acts_;
  ForwardInputs inputs_;  // of the last begin_forward()
  int64_t counted_ = 0;   // positions whose target is not ignore_index
  Tensor tokens_in_use_;  // acts_.tokens, or the staged tokens of the current micro-batch
  bool backward_ready_ = false;
  bool lookup_deferred_ = false;  // defer_embedding_lookup(), for the next backward()
  std::unique_ptr<Fp8Scaling> fp8_;
  GradientsFinal gradients_final_;
  // Tells the listener that every gradient from `first`'s start on is final.
  void announce_final(const Tensor& first) const {
    if (gradients_final_) gradients_final_(first.as<float>() - flat_.grads.as<float>());
  }
  // Whether the current forward drops (a training forward of a model with hidden dropout).
  bool training() const { return inputs_.gradients != GradientPass::None; }
  // Whether the current forward drops hidden states, attention probabilities (training forwards only).
  bool drops_hidden() const { return training() && config_.hidden_dropout > 0.0f; }
  bool drops_attention() const { return training() && config_.attention_dropout > 0.0f; }
  // The blocks as one stack (block_stack.h), with the current forward's dropout.
  BlockStackPass blocks() const;
  // Block `layer`'s dropout for the current forward (none where it does not drop).
  BranchDropout block_dropout(int64_t layer) const;
  AttentionDropout attention_dropout(int64_t layer) const;
  // The embedding output's dropout, in place on `values`: the forward's activations or, with the
  // same mask, the backward's gradient there.
  void drop_embedding_output(const Tensor& values);
  const Fp8Matmul* classifier_fp8() const { return fp8_ ? fp8_->classifier() : nullptr; }
  // How the current training forward's backward stores its parameter gradients.
  GradStore grad_store() const {
    return inputs_.gradients == GradientPass::Write ? GradStore::Write : GradStore::Add;
  }
};

// GPT before it is built (model.h).
class GptArchitecture final : public ModelArchitecture {
 public:
  explicit GptArchitecture(const GptConfig& config) : config_(config) {}
  ModelInput input() const override { return ModelInput::NextTokens; }
  std::string describe() const override;
  int64_t num_parameters() const override { return ParameterLayout(config_).total(); }
  double closed_form_parameters() const override;
  size_t activation_bytes(int64_t batch, int64_t seq, const RecomputePolicy& policy, DType dtype, int64_t logit_rows,
                          const Fp8Recipe* fp8) const override;
  Backend::WorkspaceNeeds workspace_needs(int64_t batch, int64_t seq, DType dtype, const Fp8Recipe* fp8,
                                          int64_t logit_rows) const override {
    return Gpt::workspace_needs(config_, batch, seq, dtype, fp8, logit_rows);
  }
  // Narayanan et al. 2021's closed forms (perf/flops.h).
  double flops_per_iteration(int64_t global_batch, int64_t seq, bool full_recompute) const override;
  std::unique_ptr<Model> build(Backend& backend, DType dtype, int64_t flat_multiple) const override {
    return std::make_unique<Gpt>(config_, backend, dtype, flat_multiple);
  }

 private:
  GptConfig config_;
};

}  // namespace kiln
