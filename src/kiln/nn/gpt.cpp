#include "kiln/nn/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kiln/backend/fp8_workspace.h"
#include "kiln/core/error.h"
#include "kiln/nn/block.h"
#include "kiln/nn/block_stack.h"
#include "kiln/nn/parameter_init.h"
#include "kiln/perf/flops.h"

namespace kiln {
namespace {

bool is_residual_projection(const std::string& name) {
  return name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight");
}

}  // namespace

Gpt::Gpt(const GptConfig& config, Backend& backend, DType dtype, int64_t flat_multiple)
    : config_(config),
      backend_(backend),
      layout_((config.validate(), config)),
      flat_(backend_, layout_.total(), dtype, flat_multiple),
      weights_(GptWeights::bind(layout_, config_, flat_.params)),
      weight_grads_(GptWeights::bind(layout_, config_, flat_.grads)) {}

void Gpt::init_weights(uint64_t seed) {
  const float residual_std = config_.init_method_std / std::sqrt(2.0f * static_cast<float>(config_.num_layers));
  set_parameters(initial_parameters(layout_, seed, [&](const ParameterInfo& entry) -> InitialValues {
    if (entry.shape.rank == 1) {
      const bool gain = entry.name.ends_with("ln_1.weight") || entry.name.ends_with("ln_2.weight") ||
                        entry.name == "ln_f.weight";
      return {gain ? 1.0f : 0.0f};
    }
    // wte's padding rows stay zero: they are never predicted and never looked up.
    return {0.0f, is_residual_projection(entry.name) ? residual_std : config_.init_method_std,
            entry.name == "wte.weight" ? config_.vocab_size * config_.hidden_size : -1};
  }));
}

void Gpt::set_parameters(std::span<const float> values) { flat_.set(backend_, values); }

void Gpt::allocate_activations(int64_t max_batch, int64_t max_seq, const RecomputePolicy& policy,
                               int64_t logit_rows) {
  KILN_CHECK(max_batch > 0 && max_seq > 0, "batch {} and sequence {} must be positive", max_batch,
             max_seq);
  KILN_CHECK(max_seq <= config_.max_position_embeddings,
             "seq_length {} exceeds max_position_embeddings {}", max_seq,
             config_.max_position_embeddings);
  KILN_CHECK(!classifier_fp8() || logit_rows % 16 == 0,
             "an fp8 classifier takes its positions in chunks of a multiple of 16 (the fp8 products' dimensions), "
             "not {}", logit_rows);
  const size_t bytes =
      GptActivations::bytes_needed(config_, max_batch, max_seq, policy, dtype(), logit_rows, fp8_ != nullptr,
                                   classifier_fp8() != nullptr);
  arena_.reset();
  activation_buffer_ = backend_.allocate(bytes);
  arena_ = std::make_unique<Arena>(activation_buffer_->data(), bytes);
  max_batch_ = max_batch;
  max_seq_ = max_seq;
  recompute_ = policy;
  logit_rows_ = logit_rows;
  acts_ = GptActivations::lay_out(*arena_, config_, max_batch, max_seq, backend_.device(), recompute_, dtype(),
                                  logit_rows_, fp8_ != nullptr, classifier_fp8() != nullptr);
  workspace_bytes_ =
      backend_.reserve_workspace(workspace_needs(config_, max_batch, max_seq, dtype(),
                                                 fp8_ ? &fp8_->recipe() : nullptr, logit_rows_));
}

void Gpt::enable_fp8(const Fp8Recipe& recipe) {
  KILN_CHECK(dtype() == DType::BF16 || dtype() == DType::F16, "fp8 products need a bf16 or fp16 model, not {}",
             dtype_name(dtype()));
  KILN_CHECK(arena_ == nullptr, "Gpt::enable_fp8 after allocate_activations");
  fp8_ = std::make_unique<Fp8Scaling>(backend_, config_.num_layers, recipe);
}

Backend::WorkspaceNeeds Gpt::workspace_needs(const GptConfig& config, int64_t batch, int64_t seq, DType dtype,
                                             const Fp8Recipe* fp8, int64_t logit_rows) {
  // The widest bias is the MLP's first, 4C; every LayerNorm is C wide.
  const int64_t C = config.hidden_size, M = batch * seq;
  Backend::WorkspaceNeeds needs{batch, seq, config.num_heads, C / config.num_heads, dtype, 4 * C};
  needs.widest_layernorm = C;
  if (!fp8) return needs;
  // The blocks' products, ln_f's backward casting the last block's output gradient (not under hidden
  // dropout, block.h).
  needs.fp8_cast_bytes = block_stack_fp8_cast_bytes(M, C, lays_out_residual_gradient_codes(config.hidden_dropout));
  // The classifier, a chunk of positions at a time, C -> Vp, reading its output gradient as the
  // codes the loss cast and wte's as cast once for every chunk (activations.h), and casting ln_f's
  // output itself.
  if (fp8->classifier)
    needs.fp8_cast_bytes = std::max(
        needs.fp8_cast_bytes, fp8_cast_bytes(std::min(logit_rows, M), C, config.padded_vocab_size(),
                                             /*in_codes_kept=*/false, /*dout_codes_given=*/true,
                                             /*weight_codes_given=*/true));
  return needs;
}

double Gpt::forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t batch,
                    int64_t seq, GradientPass gradients, float loss_scale, GptStagedInputs staged,
                    DropoutDraw dropout) {
  begin_forward(tokens, targets, batch, seq, gradients, loss_scale, staged, dropout);
  forward_ops();
  return loss();
}

void Gpt::begin_forward(const MicroBatch& batch, GradientPass gradients, float loss_scale, DropoutDraw dropout) {
  begin_forward(batch.tokens, batch.targets, batch.batch, batch.seq, gradients, loss_scale,
                GptStagedInputs{batch.device_tokens, batch.device_targets}, dropout);
}

void Gpt::begin_forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                        int64_t batch, int64_t seq, GradientPass gradients, float loss_scale,
                        GptStagedInputs staged, DropoutDraw dropout) {
  KILN_CHECK(arena_ != nullptr, "Gpt::forward before allocate_activations");
  KILN_CHECK(batch > 0 && seq > 0 && batch <= max_batch_ && seq <= max_seq_,
             "batch {} x sequence {} exceeds the planned {} x {}", batch, seq, max_batch_, max_seq_);
  const size_t positions = static_cast<size_t>(batch * seq);
  KILN_CHECK(tokens.size() == positions, "{} tokens given for {} x {} positions", tokens.size(),
             batch, seq);
  KILN_CHECK(targets.empty() || targets.size() == positions, "{} targets given for {} positions",
             targets.size(), positions);
  KILN_CHECK(gradients == GradientPass::None || !targets.empty(), "a training forward needs targets");
  KILN_CHECK((staged.tokens == nullptr) == (staged.targets == nullptr),
             "staged inputs carry both tokens and targets, or neither");
  for (size_t i = 0; i < positions; ++i)
    KILN_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size,
               "token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i,
               config_.vocab_size);
  counted_ = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const int32_t target = targets[i];
    KILN_CHECK(target == ignore_index() || (target >= 0 && target < config_.vocab_size),
               "target id {} at position {} is outside the vocabulary [0, {})", target, i,
               config_.vocab_size);
    counted_ += target != ignore_index();
  }
  if (batch != acts_.batch || seq != acts_.seq) {
    arena_->reset();
    acts_ = GptActivations::lay_out(*arena_, config_, batch, seq, backend_.device(), recompute_,
                                    dtype(), logit_rows_, fp8_ != nullptr, classifier_fp8() != nullptr);
  }
  inputs_ = ForwardInputs{};
  inputs_.batch = batch;
  inputs_.seq = seq;
  inputs_.gradients = gradients;
  if (drops_hidden() || drops_attention()) inputs_.dropout = dropout;
  inputs_.tokens = staged.tokens ? staged.tokens : acts_.tokens.as<int32_t>();
  if (!staged.tokens)
    backend_.copy_to_device(acts_.tokens.data, tokens.data(), positions * sizeof(int32_t));
  if (!targets.empty()) {
    inputs_.targets = staged.targets ? staged.targets : acts_.targets.as<int32_t>();
    if (!staged.targets)
      backend_.copy_to_device(acts_.targets.data, targets.data(), positions * sizeof(int32_t));
    inputs_.gradient_scale = counted_ ? loss_scale / static_cast<float>(counted_) : 0.0f;
  }
  tokens_in_use_ = acts_.tokens;
  tokens_in_use_.data = const_cast<int32_t*>(inputs_.tokens);  // read only by the ops
  backward_ready_ = false;
}

void Gpt::forward_ops() {
  KILN_CHECK(inputs_.tokens != nullptr, "Gpt::forward_ops without begin_forward");
  backend_.embedding_forward({acts_.embedded, tokens_in_use_, weights_.wte, weights_.wpe});
  if (drops_hidden()) drop_embedding_output(acts_.embedded);
  const Tensor input = block_stack_forward(backend_, blocks(), acts_.embedded, inputs_.gradients != GradientPass::None);
  backend_.layernorm_forward({acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, input, weights_.lnf_weight,
                              weights_.lnf_bias, config_.layernorm_eps});
  backward_ready_ = false;
  if (!inputs_.targets) return;

  Tensor targets_in_use = acts_.targets;
  targets_in_use.data = const_cast<int32_t*>(inputs_.targets);
  // Classifier (tied to wte) and loss, a chunk of positions at a time; in training each chunk's
  // logits gradient goes straight back through the classifier.
  const int64_t rows = inputs_.batch * inputs_.seq, C = config_.hidden_size,
                Vp = config_.padded_vocab_size();
  const int64_t chunk = acts_.logits.shape[0];
  const Fp8Matmul* fp8 = classifier_fp8();
  const bool prepare_backward = inputs_.gradients != GradientPass::None;
  if (fp8)  // wte's codes, once for every chunk's products (activations.h)
    backend_.convert({acts_.wte_fp8, weights_.wte, &fp8->weight, prepare_backward ? acts_.wte_fp8_t : Tensor{}});
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    const Tensor logits = acts_.logits.slice(0, n * Vp).reshaped({n, Vp});
    const Tensor lnf = acts_.lnf.slice(first * C, n * C).reshaped({n, C});
    MatmulForward classify{logits, lnf, weights_.wte, Tensor{}, WeightLayout::OutIn, Tensor{}, fp8};
    if (fp8) classify.weight_fp8 = acts_.wte_fp8;
    backend_.matmul_forward(classify);
    SoftmaxCrossEntropy loss{logits, acts_.losses.slice(first, n), targets_in_use.slice(first, n),
                             config_.vocab_size, ignore_index(), inputs_.gradient_scale, prepare_backward};
    // The first chunk writes wte's gradient if the pass does; the others add.
    MatmulBackward classifier{acts_.d_hidden.slice(first * C, n * C).reshaped({n, C}), weight_grads_.wte,
                              Tensor{}, logits, lnf, weights_.wte, WeightLayout::OutIn};
    classifier.param_store = first == 0 ? grad_store() : GradStore::Add;
    if (fp8 && prepare_backward) {  // the loss casts the gradient for the backward (ops.h)
      classifier.fp8 = fp8;
      classifier.weight_fp8 = acts_.wte_fp8_t;
      read_gradient_codes(classifier, acts_.logit_codes.slice(0, 2 * n * Vp));
      loss.fp8 = fp8;
      loss.grad_fp8 = classifier.dout;
      loss.grad_fp8_t = classifier.dout_fp8_t;
    }
    backend_.softmax_cross_entropy(loss);
    if (prepare_backward) backend_.matmul_backward(classifier);
  }
  backward_ready_ = prepare_backward;
}

double Gpt::loss() {
  if (!inputs_.targets || counted_ == 0) return 0.0;
  const auto positions = static_cast<size_t>(inputs_.batch * inputs_.seq);
  std::vector<float> losses(positions);
  backend_.copy_to_host(losses.data(), acts_.losses.data, positions * sizeof(float));
  double sum = 0.0;
  for (float loss : losses) sum += loss;
  return sum / static_cast<double>(counted_);
}

void Gpt::backward() {
  KILN_CHECK(backward_ready_, "Gpt::backward without a preceding training forward");
  backward_ready_ = false;
  const BlockStackPass stack = blocks();
  const int64_t layers = config_.num_layers;
  const Tensor last_residual = layers ? acts_.stack.blocks[static_cast<size_t>(layers - 1)].residual_out : acts_.embedded;
  // The classifier's backward ran in forward: d_hidden holds d ln_f. ln_f's backward is the first
  // to reach the residual stream's gradient, so it writes it; every later one adds.
  // With fp8 each LayerNorm backward also casts the residual stream's gradient for the MLP c_proj
  // of the block before it, where that reads it undropped (block.h).
  const GradStore store = grad_store();
  backend_.layernorm_backward(layernorm_backward_feeding(
      {acts_.d_residual, weight_grads_.lnf_weight, weight_grads_.lnf_bias, acts_.d_hidden, last_residual,
       weights_.lnf_weight, acts_.lnf_mean, acts_.lnf_rstd, store, GradStore::Write},
      input_gradient_reader(stack, weight_grads_.blocks, layers), acts_.d_residual_fp8));
  announce_final(weight_grads_.lnf_weight);
  block_stack_backward(backend_, stack, weight_grads_.blocks, acts_.embedded,
                       BlockScratch{acts_.d_hidden, acts_.d_qkv, acts_.d_fc, acts_.d_residual_fp8}, acts_.d_residual,
                       store, [this](const Tensor& first) { announce_final(first); });
  if (drops_hidden()) drop_embedding_output(embedding_output_gradient());  // d_residual, before the lookup
  if (std::exchange(lookup_deferred_, false)) return;  // the caller adds it (add_embedding_lookup)
  // wte's gradient has the classifier's part already: the embedding's is added to it.
  backend_.embedding_backward({weight_grads_.wte, weight_grads_.wpe, acts_.d_residual, tokens_in_use_, store});
  announce_final(flat_.grads);
}

BlockStackPass Gpt::blocks() const {
  return {config_, weights_.blocks, acts_.stack, fp8_.get(),
          [this](int64_t layer) {
            return BlockPass{AttentionMask::Causal, Tensor{}, block_dropout(layer), attention_dropout(layer)};
          }};
}

AttentionDropout Gpt::attention_dropout(int64_t layer) const {
  if (!drops_attention()) return {};
  const DropoutDraw& draw = inputs_.dropout;
  return {config_.attention_dropout, dropout_key(draw), dropout_stream(draw, layer, DropoutSite::AttentionProbabilities)};
}

BranchDropout Gpt::block_dropout(int64_t layer) const {
  if (!drops_hidden()) return {};
  const DropoutDraw& draw = inputs_.dropout;
  return {config_.hidden_dropout, dropout_key(draw), dropout_stream(draw, layer, DropoutSite::AttentionOutput),
          dropout_stream(draw, layer, DropoutSite::MlpOutput)};
}

void Gpt::drop_embedding_output(const Tensor& values) {
  const DropoutDraw& draw = inputs_.dropout;
  backend_.dropout({values, values, config_.hidden_dropout, dropout_key(draw),
                    dropout_stream(draw, 0, DropoutSite::Embedding)});
}

void Gpt::defer_embedding_lookup() {
  KILN_CHECK(backward_ready_, "Gpt::defer_embedding_lookup without a preceding training forward");
  lookup_deferred_ = true;
  // The lookup would have written wpe's gradient on a writing pass: what it adds later lands on zeros.
  if (grad_store() == GradStore::Write) backend_.fill({weight_grads_.wpe, 0.0f});
}

Tensor Gpt::embedding_output_gradient() const {
  return acts_.d_residual.slice(0, inputs_.batch * inputs_.seq * config_.hidden_size)
      .reshaped({inputs_.batch, inputs_.seq, config_.hidden_size});
}

void Gpt::add_embedding_lookup(const Tensor& dout, const Tensor& tokens) {
  backend_.embedding_backward({weight_grads_.wte, weight_grads_.wpe, dout, tokens, GradStore::Add});
}

int64_t Gpt::embedding_gradients_end() const {
  const ParameterInfo& wpe = layout_.find("wpe.weight");
  return wpe.offset + wpe.shape.numel();
}

Shape Gpt::stored_shape(const ParameterInfo& info) const {
  if (info.name == "wte.weight") return Shape{config_.vocab_size, config_.hidden_size};
  return info.shape;
}

std::vector<float> Gpt::logits_at(int64_t batch_index, int64_t position) {
  KILN_CHECK(batch_index >= 0 && batch_index < acts_.batch && position >= 0 && position < acts_.seq,
             "logits_at({}, {}) outside the last forward's {} x {}", batch_index, position,
             acts_.batch, acts_.seq);
  const int64_t row = batch_index * acts_.seq + position, C = config_.hidden_size;
  const Tensor logits = acts_.logits.slice(0, config_.padded_vocab_size()).reshaped({1, config_.padded_vocab_size()});
  backend_.matmul_forward({logits, acts_.lnf.slice(row * C, C).reshaped({1, C}), weights_.wte, Tensor{},
                           WeightLayout::OutIn});
  std::vector<char> stored(static_cast<size_t>(config_.vocab_size) * dtype_size(logits.dtype));
  backend_.copy_to_host(stored.data(), logits.data, stored.size());
  std::vector<float> values(static_cast<size_t>(config_.vocab_size));
  widen_to_fp32(stored.data(), logits.dtype, values.data(), config_.vocab_size);
  return values;
}

std::string GptArchitecture::describe() const {
  return fmt::format("GPT: {} layers, hidden {}, {} heads, vocabulary {} (padded {}), {} positions: {} parameters",
                     config_.num_layers, config_.hidden_size, config_.num_heads, config_.vocab_size,
                     config_.padded_vocab_size(), config_.max_position_embeddings, num_parameters());
}

size_t GptArchitecture::activation_bytes(int64_t batch, int64_t seq, const RecomputePolicy& policy, DType dtype,
                                         int64_t logit_rows, const Fp8Recipe* fp8) const {
  return GptActivations::bytes_needed(config_, batch, seq, policy, dtype, logit_rows, fp8 != nullptr,
                                      fp8 && fp8->classifier);
}

double GptArchitecture::closed_form_parameters() const {
  return gpt_closed_form_parameters(config_.num_layers, config_.hidden_size, config_.vocab_size,
                                    config_.max_position_embeddings);
}

double GptArchitecture::flops_per_iteration(int64_t global_batch, int64_t seq, bool full_recompute) const {
  return kiln::flops_per_iteration(
      FlopsShape{global_batch, seq, config_.num_layers, config_.hidden_size, config_.vocab_size}, full_recompute);
}

}  // namespace kiln
