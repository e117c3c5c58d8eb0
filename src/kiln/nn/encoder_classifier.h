// An encoder classifier: a BERT-like sequence classifier (the seed lab's model) with explicit
// forward and backward on any Backend, built from GPT's blocks and ops.
//
//   x = dropout(wte[ids] + wpe[position] + wtt[type])     (type 0 everywhere: one text a sample)
//   x = block(x) for each of num_layers pre-LayerNorm blocks (block.h), the attention
//       bidirectional under the key-padding mask (ops.h, AttentionMask::KeyPadding)
//   x = x + dropout(gelu(x W_j + b_j)) for each of num_intermediate_layers residual layers
//   h = ln_f(x) * mask;  pooled = tanh(h[:, 0] W_p + b_p)   (mask: 1 a real token, 0 padding;
//                                                            the pooler reads the first position)
//   logits = gelu(pooled W_1 + b_1) W_2 + b_2;  loss = mean cross-entropy over the labels
// Dropout (EncoderConfig::hidden_dropout, and attention_dropout on the blocks' attention
// probabilities) runs in training forwards only, with the masks a
// DropoutDraw names (dropout_streams.h; the intermediate layers draw as layers num_layers + j),
// drawn again by the backward. The final hidden states h are 0 at padded positions, and so is
// their gradient (ops.h, MaskRows). Only the first position, always a real token, reaches the
// loss, so the zeroing changes no loss or gradient; the padding mask keeps every real position's
// hidden state from depending on padding (tested).
//
// Parameters (the flat-buffer layout of parameters.h, Linear weights [in, out] as GPT-2's):
//   embeddings.word_embeddings.weight [Vp, C], embeddings.position_embeddings.weight [P, C],
//   embeddings.token_type_embeddings.weight [2, C] (EncoderConfig::kTokenTypes: segments A and
//   B), encoder.layer.{i}.{ln_1, attention.qkv, attention.output.dense, ln_2,
//   intermediate.dense, output.dense}.{weight, bias}, intermediate.{j}.dense.{weight, bias},
//   final_layer_norm.{weight, bias}, pooler.dense.{weight, bias}, classifier.dense.{weight, bias},
//   classifier.out_proj.{weight, bias}.
// Precision, gradients and ownership as Gpt's (gpt.h): parameters and activations in the compute
// dtype, gradients fp32, written or added as the forward's GradientPass says.
// As a Model (model.h) it reads the two rows of data/classification_tokens.h (ModelInput::
// LabelledSequences), unpacked on the host. The blocks recompute as GPT's do (block_stack.h).
// kiln's data has no segments, so every token is of type 0 and the forward adds row 0 to every
// position. That row is then redundant with the position embeddings (wpe[t] + wtt[0] for every
// t), and training it only doubles Adam's steps on the embeddings' shared shift: on the
// SpamAssassin demo it cost 1.3 to 2.6 points of validation accuracy on each of three seeds
// (docs/classifier.md). So the token types' table is held: its gradient is zero and it has no
// weight decay, so it keeps its initial (or loaded) values. Not yet: sentence pairs (type 1,
// which would train the table). Not thread-safe.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/core/arena.h"
#include "kiln/nn/activations.h"
#include "kiln/nn/block.h"
#include "kiln/nn/block_stack.h"
#include "kiln/nn/dropout_streams.h"
#include "kiln/nn/encoder_config.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/model.h"
#include "kiln/nn/parameters.h"

namespace kiln {

// A micro-batch of classification samples on the host, row-major.
struct ClassificationBatch {
  std::span<const int32_t> input_ids;       // [B * T], each in [0, vocab_size)
  std::span<const int32_t> attention_mask;  // [B * T], 1 for a real token, 0 for padding
  std::span<const int32_t> labels;          // [B], each in [0, num_labels) or kUncountedTarget; empty: no loss
};

// The two rows of a micro-batch of `batch` classification samples of `seq` positions, as
// data/classification_tokens.h packs them (ids; label, mask[1], ..., mask[T - 1]), unpacked.
struct UnpackedClassification {
  std::vector<int32_t> input_ids, attention_mask;  // [batch x seq]
  std::vector<int32_t> labels;                     // [batch]
  ClassificationBatch view() const { return {input_ids, attention_mask, labels}; }
};
UnpackedClassification unpack_classification(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                             int64_t batch, int64_t seq);

// What the model keeps from a forward for its backward, and its backward scratch, for (B, T).
struct EncoderActivations {
  int64_t batch = 0, seq = 0;
  Tensor tokens, key_mask;  // [B, T] int32
  Tensor labels;            // [B] int32
  Tensor token_types;       // [1, T] int32, all 0 (one segment)
  Tensor placed;            // [T, C] what each position adds to its token: wpe[t] + wtt[token_types[t]]
  Tensor embedded;          // [B, T, C], the blocks' input
  BlockStackActivations stack;  // the blocks', under the recompute policy (activations.h)
  std::vector<Tensor> intermediate_pre, intermediate_out;  // [B, T, C] each: GELU's input, the layer's output
  Tensor branch;            // [B, T, C] an intermediate layer's GELU output, then its gradient (shared)
  Tensor lnf, lnf_mean, lnf_rstd;  // lnf: the final hidden states h (above), padding zeroed
  Tensor first, pooled, head_pre, head;  // [B, C]
  Tensor logits;            // [B, num_labels]: the logits, then their gradient
  Tensor losses;            // [B] fp32
  Tensor d_residual, d_hidden;  // [B, T, C]
  Tensor d_qkv, d_fc;           // [B, T, 3C], [B, T, 4C], one stretch (never in use at once)
  Tensor d_first, d_pooled, d_head;  // [B, C]
  Tensor d_placed;                   // [T, C] fp32
  Tensor d_residual_fp8;             // fp8, no hidden dropout: [2 x B*T x C] codes of d_residual

  // `fp8`: the blocks' products are fp8 (their inputs' codes kept, activations.h; d_residual_fp8).
  static EncoderActivations lay_out(Arena& arena, const EncoderConfig& config, int64_t batch, int64_t seq,
                                    Device device, DType dtype, const RecomputePolicy& policy = {}, bool fp8 = false);
  static size_t bytes_needed(const EncoderConfig& config, int64_t batch, int64_t seq, DType dtype,
                             const RecomputePolicy& policy = {}, bool fp8 = false);
};

// The layout of the encoder's parameters (above), in order.
ParameterLayout encoder_parameter_layout(const EncoderConfig& config);

class EncoderClassifier final : public Model {
 public:
  EncoderClassifier(const EncoderConfig& config, Backend& backend, DType dtype = DType::F32,
                    int64_t flat_multiple = 1);

  const EncoderConfig& config() const { return config_; }
  const ParameterLayout& layout() const override { return layout_; }
  const FlatParameters& flat() const override { return flat_; }

  // N(0, std) for matrices and embeddings, the residual branches' output projections (the blocks'
  // two and the intermediate layers') scaled by 1/sqrt(2 x (layers + intermediate layers)), zero
  // biases, unit LayerNorm gains, zero padding rows; drawn in fp32, rounded to dtype().
  void init_weights(uint64_t seed) override;
  void set_parameters(std::span<const float> values) override;
  // The word embeddings without their padding rows.
  Shape stored_shape(const ParameterInfo& info) const override;

  // The blocks' four products in fp8 (fp8_scaling.h), as GPT's; the intermediate layers, pooler and
  // head stay in the compute dtype. Needs a bf16 or fp16 model and both dropout rates 0; refuses
  // recipe.classifier (GPT's tied classifier), naming it. Before allocate_activations.
  void enable_fp8(const Fp8Recipe& recipe) override;
  Fp8Scaling* fp8() const override { return fp8_.get(); }
  // Plans and allocates activation memory once, for batches up to max_batch x max_seq, keeping or
  // recomputing the blocks' activations as `policy` says (recompute.h; the intermediate layers and
  // the head keep theirs); `logit_rows` does not apply (one row of logits a sample).
  void allocate_activations(int64_t max_batch, int64_t max_seq, const RecomputePolicy& policy = {},
                            int64_t logit_rows = kDefaultLogitRows) override;
  size_t activation_bytes() const override { return arena_ ? arena_->capacity() : 0; }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  // The op scratch at that shape, with the blocks' fp8 casts under `fp8` (null: none).
  static Backend::WorkspaceNeeds workspace_needs(const EncoderConfig& config, int64_t batch, int64_t seq, DType dtype,
                                                 const Fp8Recipe* fp8 = nullptr);

  // Runs the model on `batch` of `batch_size` samples of `seq` tokens. With labels, returns the
  // mean loss over the samples whose label counts (not kUncountedTarget; 0 if none does); with a
  // `gradients` pass it prepares backward(), whose parameter gradients are d(loss_scale x mean
  // loss). Without labels returns 0.
  double forward(const ClassificationBatch& batch, int64_t batch_size, int64_t seq,
                 GradientPass gradients = GradientPass::None, float loss_scale = 1.0f, DropoutDraw dropout = {});
  using Model::forward;
  // The Model's forward in three parts: the rows are unpacked (unpack_classification) and copied.
  void begin_forward(const MicroBatch& batch, GradientPass gradients = GradientPass::None, float loss_scale = 1.0f,
                     DropoutDraw dropout = {}) override;
  void forward_ops() override;
  double loss() override;
  int64_t counted() const override { return counted_; }
  const ForwardInputs& forward_inputs() const override { return inputs_; }
  // The parameter gradients of the last forward (a training one) into grads().
  void backward() override;
  // The listener hears the head's, pooler's and final LayerNorm's gradients, then the intermediate
  // layers' and each block's from the last, then all.
  void set_gradients_final_listener(GradientsFinal listener) override { gradients_final_ = std::move(listener); }
  // The last forward's logits [batch, num_labels], on the host; not after a training forward, whose
  // loss writes their gradient over them.
  std::vector<float> logits();
  // Each sample's most likely label, from logits().
  std::vector<int32_t> predictions();
  void count_predictions(ConfusionMatrix& counts) override;
  int64_t num_labels() const override { return config_.num_labels; }

 private:
  struct Weights {
    Tensor wte, wpe, wtt;  // word, position and token-type embeddings
    std::vector<BlockWeights> blocks;
    std::vector<Tensor> intermediate_weight, intermediate_bias;
    Tensor lnf_weight, lnf_bias, pooler_weight, pooler_bias, dense_weight, dense_bias, out_weight, out_bias;
    static Weights bind(const ParameterLayout& layout, const EncoderConfig& config, const Tensor& flat);
  };
  // Lays the activations out in the arena for batch x seq and writes their constant part, the
  // token types (all 0), once for every forward at that shape.
  void lay_out_activations(int64_t batch, int64_t seq);
  // Checks the batch on the host and copies it to the device; the ops follow in forward_ops().
  void begin(const ClassificationBatch& batch, int64_t batch_size, int64_t seq, GradientPass gradients,
             float loss_scale, DropoutDraw dropout);
  bool training() const { return inputs_.gradients != GradientPass::None; }
  // Whether the current forward drops hidden states, attention probabilities (training forwards only).
  bool drops_hidden() const { return training() && config_.hidden_dropout > 0.0f; }
  bool drops_attention() const { return training() && config_.attention_dropout > 0.0f; }
  BlockPass block_pass(int64_t layer) const;
  // The blocks as one stack (block_stack.h), with the current forward's mask and dropout.
  BlockStackPass blocks() const;
  Dropout branch_dropout(const Tensor& out, const Tensor& in, int64_t layer, DropoutSite site,
                         const Tensor& residual = {}) const;
  GradStore grad_store() const { return inputs_.gradients == GradientPass::Write ? GradStore::Write : GradStore::Add; }
  // Tells the listener that every gradient from `first`'s start on is final.
  void announce_final(const Tensor& first) const {
    if (gradients_final_) gradients_final_(first.as<float>() - flat_.grads.as<float>());
  }

  EncoderConfig config_;
  GptConfig block_shape_;  // config_.block_shape(), which the stack's pass refers to
  Backend& backend_;
  ParameterLayout layout_;
  FlatParameters flat_;
  Weights weights_, weight_grads_;
  std::unique_ptr<Fp8Scaling> fp8_;  // with enable_fp8
  std::unique_ptr<DeviceBuffer> activation_buffer_;
  std::unique_ptr<Arena> arena_;  // borrows activation_buffer_
  int64_t max_batch_ = 0, max_seq_ = 0;
  RecomputePolicy recompute_;
  size_t workspace_bytes_ = 0;
  EncoderActivations acts_;
  ForwardInputs inputs_;  // of the last begin
  std::vector<int32_t> labels_;  // of the last forward, on the host (count_predictions)
  int64_t counted_ = 0;          // its labels that count (not kUncountedTarget)
  bool backward_ready_ = false;
  bool logits_hold_gradient_ = false;  // the last forward was a training one
  GradientsFinal gradients_final_;
};

// The encoder classifier before it is built (model.h).
class EncoderArchitecture final : public ModelArchitecture {
 public:
  explicit EncoderArchitecture(const EncoderConfig& config) : config_(config) {}
  ModelInput input() const override { return ModelInput::LabelledSequences; }
  std::string describe() const override;
  int64_t num_parameters() const override { return encoder_parameter_layout(config_).total(); }
  double closed_form_parameters() const override;
  size_t activation_bytes(int64_t batch, int64_t seq, const RecomputePolicy& policy, DType dtype, int64_t logit_rows,
                          const Fp8Recipe* fp8) const override;
  Backend::WorkspaceNeeds workspace_needs(int64_t batch, int64_t seq, DType dtype, const Fp8Recipe* fp8,
                                          int64_t logit_rows) const override;
  // perf/flops.h's encoder form.
  double flops_per_iteration(int64_t global_batch, int64_t seq, bool full_recompute) const override;
  std::unique_ptr<Model> build(Backend& backend, DType dtype, int64_t flat_multiple) const override {
    return std::make_unique<EncoderClassifier>(config_, backend, dtype, flat_multiple);
  }

 private:
  EncoderConfig config_;
};

}  // namespace kiln
