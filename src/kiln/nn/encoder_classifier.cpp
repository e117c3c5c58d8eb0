#include "kiln/nn/encoder_classifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/nn/parameter_init.h"
#include "kiln/perf/flops.h"

namespace kiln {
namespace {

std::string block_prefix(int64_t layer) { return fmt::format("encoder.layer.{}.", layer); }
std::string intermediate_prefix(int64_t layer) { return fmt::format("intermediate.{}.dense.", layer); }

bool is_residual_output(const std::string& name) {
  return name.ends_with("attention.output.dense.weight") || name.ends_with(".output.dense.weight") ||
         (name.starts_with("intermediate.") && name.ends_with(".weight"));
}

bool is_layernorm_gain(const std::string& name) {
  return name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name == "final_layer_norm.weight";
}

// With fp8, whether the final LayerNorm's backward casts the last block's output gradient for its
// MLP c_proj, as GPT's ln_f does (block.h): only where it writes that gradient, with no
// intermediate layers in between; otherwise the last block's MLP casts it itself.
bool final_norm_casts_blocks_gradient(const EncoderConfig& config) { return config.num_intermediate_layers == 0; }

}  // namespace

ParameterLayout encoder_parameter_layout(const EncoderConfig& config) {
  const int64_t C = config.hidden_size;
  ParameterLayout layout;
  layout.add("embeddings.word_embeddings.weight", {config.padded_vocab_size(), C}, true);
  layout.add("embeddings.position_embeddings.weight", {config.max_position_embeddings, C}, true);
  layout.add("embeddings.token_type_embeddings.weight", {EncoderConfig::kTokenTypes, C}, false);  // held: no decay
  const auto linear = [&](const std::string& prefix, int64_t in, int64_t out) {
    layout.add(prefix + "weight", {in, out}, true);
    layout.add(prefix + "bias", {out}, false);
  };
  const auto layernorm = [&](const std::string& prefix) {
    layout.add(prefix + "weight", {C}, false);
    layout.add(prefix + "bias", {C}, false);
  };
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = block_prefix(layer);
    layernorm(prefix + "ln_1.");
    linear(prefix + "attention.qkv.", C, 3 * C);
    linear(prefix + "attention.output.dense.", C, C);
    layernorm(prefix + "ln_2.");
    linear(prefix + "intermediate.dense.", C, 4 * C);
    linear(prefix + "output.dense.", 4 * C, C);
  }
  for (int64_t layer = 0; layer < config.num_intermediate_layers; ++layer) linear(intermediate_prefix(layer), C, C);
  layernorm("final_layer_norm.");
  linear("pooler.dense.", C, C);
  linear("classifier.dense.", C, C);
  linear("classifier.out_proj.", C, config.num_labels);
  return layout;
}

UnpackedClassification unpack_classification(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                             int64_t batch, int64_t seq) {
  const auto positions = static_cast<size_t>(batch * seq);
  KILN_CHECK(tokens.size() == positions && targets.size() == positions,
             "{} tokens and {} targets given for {} x {} positions", tokens.size(), targets.size(), batch, seq);
  UnpackedClassification unpacked;
  unpacked.input_ids.assign(tokens.begin(), tokens.end());
  unpacked.attention_mask.assign(targets.begin(), targets.end());
  for (int64_t b = 0; b < batch; ++b) {
    int32_t& first = unpacked.attention_mask[static_cast<size_t>(b * seq)];
    unpacked.labels.push_back(first);
    first = 1;  // the first position is always a real token (data/classification_tokens.h)
  }
  return unpacked;
}

EncoderClassifier::Weights EncoderClassifier::Weights::bind(const ParameterLayout& layout, const EncoderConfig& config,
                                                             const Tensor& flat) {
  const auto view = [&](const std::string& name) { return layout.view(flat, name); };
  Weights w;
  w.wte = view("embeddings.word_embeddings.weight");
  w.wpe = view("embeddings.position_embeddings.weight");
  w.wtt = view("embeddings.token_type_embeddings.weight");
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const std::string p = block_prefix(layer);
    w.blocks.push_back(BlockWeights{view(p + "ln_1.weight"), view(p + "ln_1.bias"), view(p + "attention.qkv.weight"),
                                    view(p + "attention.qkv.bias"), view(p + "attention.output.dense.weight"),
                                    view(p + "attention.output.dense.bias"), view(p + "ln_2.weight"),
                                    view(p + "ln_2.bias"), view(p + "intermediate.dense.weight"),
                                    view(p + "intermediate.dense.bias"), view(p + "output.dense.weight"),
                                    view(p + "output.dense.bias")});
  }
  for (int64_t layer = 0; layer < config.num_intermediate_layers; ++layer) {
    w.intermediate_weight.push_back(view(intermediate_prefix(layer) + "weight"));
    w.intermediate_bias.push_back(view(intermediate_prefix(layer) + "bias"));
  }
  w.lnf_weight = view("final_layer_norm.weight");
  w.lnf_bias = view("final_layer_norm.bias");
  w.pooler_weight = view("pooler.dense.weight");
  w.pooler_bias = view("pooler.dense.bias");
  w.dense_weight = view("classifier.dense.weight");
  w.dense_bias = view("classifier.dense.bias");
  w.out_weight = view("classifier.out_proj.weight");
  w.out_bias = view("classifier.out_proj.bias");
  return w;
}

EncoderActivations EncoderActivations::lay_out(Arena& arena, const EncoderConfig& config, int64_t batch, int64_t seq,
                                               Device device, DType dtype, const RecomputePolicy& policy, bool fp8) {
  const int64_t B = batch, T = seq, C = config.hidden_size;
  ActivationLayout layout(arena, device, dtype);
  EncoderActivations acts;
  acts.batch = batch;
  acts.seq = seq;
  acts.tokens = layout.ints({B, T});
  acts.key_mask = layout.ints({B, T});
  acts.labels = layout.ints({B});
  acts.token_types = layout.ints({1, T});
  acts.placed = layout.take({T, C});
  acts.embedded = layout.take({B, T, C});
  acts.stack = BlockStackActivations::lay_out(layout, config.num_layers, B, T, C, config.num_heads, policy, fp8);
  for (int64_t layer = 0; layer < config.num_intermediate_layers; ++layer) {
    acts.intermediate_pre.push_back(layout.take({B, T, C}));
    acts.intermediate_out.push_back(layout.take({B, T, C}));
  }
  acts.branch = layout.take({B, T, C});
  acts.lnf = layout.take({B, T, C});
  acts.lnf_mean = layout.stats({B * T});
  acts.lnf_rstd = layout.stats({B * T});
  acts.first = layout.take({B, C});
  acts.pooled = layout.take({B, C});
  acts.head_pre = layout.take({B, C});
  acts.head = layout.take({B, C});
  acts.logits = layout.take({B, config.num_labels});
  acts.losses = layout.stats({B});
  acts.d_residual = layout.take({B, T, C});
  acts.d_hidden = layout.take({B, T, C});
  acts.d_first = layout.take({B, C});
  acts.d_pooled = layout.take({B, C});
  acts.d_head = layout.take({B, C});
  acts.d_placed = layout.stats({T, C});
  if (fp8 && lays_out_residual_gradient_codes(config.hidden_dropout)) acts.d_residual_fp8 = layout.codes({2, B * T, C});
  ArenaOverlay overlay(arena);  // a block's backward is done with d_fc before it writes d_qkv (block.h)
  acts.d_qkv = layout.take({B, T, 3 * C});
  overlay.next();
  acts.d_fc = layout.take({B, T, 4 * C});
  overlay.finish();
  return acts;
}

size_t EncoderActivations::bytes_needed(const EncoderConfig& config, int64_t batch, int64_t seq, DType dtype,
                                        const RecomputePolicy& policy, bool fp8) {
  Arena measure = Arena::measuring();
  lay_out(measure, config, batch, seq, Device::CPU, dtype, policy, fp8);
  return measure.used();
}

EncoderClassifier::EncoderClassifier(const EncoderConfig& config, Backend& backend, DType dtype,
                                     int64_t flat_multiple)
    : config_(config),
      block_shape_(config.block_shape()),
      backend_(backend),
      layout_((config.validate(), encoder_parameter_layout(config))),
      flat_(backend_, layout_.total(), dtype, flat_multiple),
      weights_(Weights::bind(layout_, config_, flat_.params)),
      weight_grads_(Weights::bind(layout_, config_, flat_.grads)) {}

void EncoderClassifier::init_weights(uint64_t seed) {
  const float residual_std =
      config_.init_method_std /
      std::sqrt(2.0f * static_cast<float>(config_.num_layers + config_.num_intermediate_layers));
  set_parameters(initial_parameters(layout_, seed, [&](const ParameterInfo& entry) -> InitialValues {
    if (entry.shape.rank == 1) return {is_layernorm_gain(entry.name) ? 1.0f : 0.0f};
    // The word embeddings' padding rows stay zero: no token looks them up.
    return {0.0f, is_residual_output(entry.name) ? residual_std : config_.init_method_std,
            entry.name == "embeddings.word_embeddings.weight" ? config_.vocab_size * config_.hidden_size : -1};
  }));
}

void EncoderClassifier::set_parameters(std::span<const float> values) { flat_.set(backend_, values); }

Shape EncoderClassifier::stored_shape(const ParameterInfo& info) const {
  if (info.name == "embeddings.word_embeddings.weight") return Shape{config_.vocab_size, config_.hidden_size};
  return info.shape;
}

void EncoderClassifier::enable_fp8(const Fp8Recipe& recipe) {
  KILN_CHECK(dtype() == DType::BF16 || dtype() == DType::F16, "fp8 products need a bf16 or fp16 model, not {}",
             dtype_name(dtype()));
  KILN_CHECK(arena_ == nullptr, "EncoderClassifier::enable_fp8 after allocate_activations");
  KILN_CHECK(!recipe.classifier,
             "the encoder classifier has no tied classifier to run in fp8 (--fp8-classifier is GPT's): its pooler and "
             "head stay in the compute dtype");
  fp8_ = std::make_unique<Fp8Scaling>(backend_, config_.num_layers, recipe);
}

Backend::WorkspaceNeeds EncoderClassifier::workspace_needs(const EncoderConfig& config, int64_t batch, int64_t seq,
                                                           DType dtype, const Fp8Recipe* fp8) {
  const int64_t C = config.hidden_size;
  Backend::WorkspaceNeeds needs{batch, seq, config.num_heads, C / config.num_heads, dtype, 4 * C};
  needs.widest_layernorm = C;
  // The blocks' products, the last block's output gradient cast for it or not (above; never under
  // hidden dropout, block.h).
  if (fp8)
    needs.fp8_cast_bytes = block_stack_fp8_cast_bytes(
        batch * seq, C, final_norm_casts_blocks_gradient(config) && lays_out_residual_gradient_codes(config.hidden_dropout));
  return needs;
}

void EncoderClassifier::allocate_activations(int64_t max_batch, int64_t max_seq, const RecomputePolicy& policy,
                                             int64_t /*logit_rows*/) {
  KILN_CHECK(max_batch > 0 && max_seq > 0, "batch {} and sequence {} must be positive", max_batch, max_seq);
  KILN_CHECK(max_seq <= config_.max_position_embeddings, "seq_length {} exceeds max_position_embeddings {}", max_seq,
             config_.max_position_embeddings);
  const size_t bytes = EncoderActivations::bytes_needed(config_, max_batch, max_seq, dtype(), policy, fp8_ != nullptr);
  arena_.reset();
  activation_buffer_ = backend_.allocate(bytes);
  arena_ = std::make_unique<Arena>(activation_buffer_->data(), bytes);
  max_batch_ = max_batch;
  max_seq_ = max_seq;
  recompute_ = policy;
  lay_out_activations(max_batch, max_seq);
  const Backend::WorkspaceNeeds needs =
      workspace_needs(config_, max_batch, max_seq, dtype(), fp8_ ? &fp8_->recipe() : nullptr);
  backend_.reserve_workspace(needs);
  workspace_bytes_ = backend_.workspace_bytes(needs);
}

void EncoderClassifier::lay_out_activations(int64_t batch, int64_t seq) {
  arena_->reset();
  acts_ = EncoderActivations::lay_out(*arena_, config_, batch, seq, backend_.device(), dtype(), recompute_,
                                      fp8_ != nullptr);
  const std::vector<int32_t> token_types(static_cast<size_t>(seq), 0);  // one segment (encoder_classifier.h)
  backend_.copy_to_device(acts_.token_types.data, token_types.data(), token_types.size() * sizeof(int32_t));
}

BlockStackPass EncoderClassifier::blocks() const {
  return {block_shape_, weights_.blocks, acts_.stack, fp8_.get(), [this](int64_t layer) { return block_pass(layer); }};
}

BlockPass EncoderClassifier::block_pass(int64_t layer) const {
  BlockPass pass{AttentionMask::KeyPadding, acts_.key_mask, {}};
  // With fp8, the last block's output gradient comes cast or not (final_norm_casts_blocks_gradient).
  pass.output_gradient_cast = layer + 1 < config_.num_layers || final_norm_casts_blocks_gradient(config_);
  const DropoutDraw& draw = inputs_.dropout;
  if (drops_hidden())
    pass.dropout = {config_.hidden_dropout, dropout_key(draw), dropout_stream(draw, layer, DropoutSite::AttentionOutput),
                    dropout_stream(draw, layer, DropoutSite::MlpOutput)};
  if (drops_attention())
    pass.attention_dropout = {config_.attention_dropout, dropout_key(draw),
                              dropout_stream(draw, layer, DropoutSite::AttentionProbabilities)};
  return pass;
}

// The dropout of a residual branch: `in` dropped (at rate 0 outside training) into `out`, plus
// `residual` where given.
Dropout EncoderClassifier::branch_dropout(const Tensor& out, const Tensor& in, int64_t layer, DropoutSite site,
                                          const Tensor& residual) const {
  const DropoutDraw& draw = inputs_.dropout;
  return {out, in, drops_hidden() ? config_.hidden_dropout : 0.0f, dropout_key(draw), dropout_stream(draw, layer, site),
          residual};
}

double EncoderClassifier::forward(const ClassificationBatch& batch, int64_t batch_size, int64_t seq,
                                  GradientPass gradients, float loss_scale, DropoutDraw dropout) {
  begin(batch, batch_size, seq, gradients, loss_scale, dropout);
  forward_ops();
  return loss();
}

void EncoderClassifier::begin_forward(const MicroBatch& batch, GradientPass gradients, float loss_scale,
                                      DropoutDraw dropout) {
  if (batch.targets.empty()) {  // no labels: the ids alone, every position real
    const std::vector<int32_t> mask(batch.tokens.size(), 1);
    begin({batch.tokens, mask, {}}, batch.batch, batch.seq, gradients, loss_scale, dropout);
    return;
  }
  const UnpackedClassification unpacked = unpack_classification(batch.tokens, batch.targets, batch.batch, batch.seq);
  begin(unpacked.view(), batch.batch, batch.seq, gradients, loss_scale, dropout);
}

void EncoderClassifier::begin(const ClassificationBatch& batch, int64_t batch_size, int64_t seq,
                              GradientPass gradients, float loss_scale, DropoutDraw dropout) {
  KILN_CHECK(arena_ != nullptr, "EncoderClassifier::forward before allocate_activations");
  KILN_CHECK(batch_size > 0 && seq > 0 && batch_size <= max_batch_ && seq <= max_seq_,
             "batch {} x sequence {} exceeds the planned {} x {}", batch_size, seq, max_batch_, max_seq_);
  const auto positions = static_cast<size_t>(batch_size * seq);
  KILN_CHECK(batch.input_ids.size() == positions && batch.attention_mask.size() == positions,
             "{} input ids and {} mask values given for {} x {} positions", batch.input_ids.size(),
             batch.attention_mask.size(), batch_size, seq);
  KILN_CHECK(batch.labels.empty() || batch.labels.size() == static_cast<size_t>(batch_size),
             "{} labels given for {} samples", batch.labels.size(), batch_size);
  KILN_CHECK(gradients == GradientPass::None || !batch.labels.empty(), "a training forward needs labels");
  for (size_t i = 0; i < positions; ++i) {
    KILN_CHECK(batch.input_ids[i] >= 0 && batch.input_ids[i] < config_.vocab_size,
               "token id {} at position {} is outside the vocabulary [0, {})", batch.input_ids[i], i,
               config_.vocab_size);
    KILN_CHECK(batch.attention_mask[i] == 0 || batch.attention_mask[i] == 1,
               "attention mask value {} at position {} is not 0 or 1", batch.attention_mask[i], i);
  }
  for (int64_t b = 0; b < batch_size; ++b)
    KILN_CHECK(batch.attention_mask[static_cast<size_t>(b * seq)] == 1,
               "sample {} has no real first token (its attention mask starts with 0): the pooler reads it", b);
  counted_ = 0;
  for (const int32_t label : batch.labels) {
    KILN_CHECK(label == kUncountedTarget || (label >= 0 && label < config_.num_labels),
               "label {} is outside [0, {}) (and not {}, which counts for nothing)", label, config_.num_labels,
               kUncountedTarget);
    counted_ += label != kUncountedTarget;
  }
  if (batch_size != acts_.batch || seq != acts_.seq) lay_out_activations(batch_size, seq);
  inputs_ = ForwardInputs{};
  inputs_.tokens = acts_.tokens.as<int32_t>();
  inputs_.targets = batch.labels.empty() ? nullptr : acts_.labels.as<int32_t>();
  inputs_.batch = batch_size;
  inputs_.seq = seq;
  inputs_.gradients = gradients;
  inputs_.gradient_scale = counted_ ? loss_scale / static_cast<float>(counted_) : 0.0f;
  if (drops_hidden() || drops_attention()) inputs_.dropout = dropout;
  labels_.assign(batch.labels.begin(), batch.labels.end());
  backend_.copy_to_device(acts_.tokens.data, batch.input_ids.data(), positions * sizeof(int32_t));
  backend_.copy_to_device(acts_.key_mask.data, batch.attention_mask.data(), positions * sizeof(int32_t));
  if (!batch.labels.empty())
    backend_.copy_to_device(acts_.labels.data, batch.labels.data(), batch.labels.size() * sizeof(int32_t));
  // A training forward's loss writes the logits' gradient over them (forward_ops).
  backward_ready_ = logits_hold_gradient_ = gradients != GradientPass::None;
}

void EncoderClassifier::forward_ops() {
  KILN_CHECK(inputs_.tokens != nullptr, "EncoderClassifier::forward_ops without begin_forward");
  // What each position adds to its token, once for all samples: wpe[t] + wtt[token_types[t]].
  backend_.embedding_forward({acts_.placed, acts_.token_types, weights_.wtt, weights_.wpe});
  backend_.embedding_forward({acts_.embedded, acts_.tokens, weights_.wte, acts_.placed});
  if (drops_hidden()) backend_.dropout(branch_dropout(acts_.embedded, acts_.embedded, 0, DropoutSite::Embedding));
  Tensor x = block_stack_forward(backend_, blocks(), acts_.embedded, inputs_.gradients != GradientPass::None);
  for (int64_t j = 0; j < config_.num_intermediate_layers; ++j) {  // x + dropout(gelu(x W + b))
    const auto index = static_cast<size_t>(j);
    backend_.matmul_forward({acts_.intermediate_pre[index], x, weights_.intermediate_weight[index],
                             weights_.intermediate_bias[index], WeightLayout::InOut, acts_.branch});
    backend_.dropout(branch_dropout(acts_.intermediate_out[index], acts_.branch, config_.num_layers + j,
                                    DropoutSite::MlpOutput, x));
    x = acts_.intermediate_out[index];
  }
  backend_.layernorm_forward({acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, x, weights_.lnf_weight, weights_.lnf_bias,
                              config_.layernorm_eps});
  backend_.mask_rows({acts_.lnf, acts_.lnf, acts_.key_mask});  // padded positions' hidden states zeroed
  backend_.gather_rows({acts_.first, acts_.lnf, 0});
  backend_.matmul_forward({acts_.pooled, acts_.first, weights_.pooler_weight, weights_.pooler_bias});
  backend_.tanh_forward({acts_.pooled, acts_.pooled});
  backend_.matmul_forward({acts_.head_pre, acts_.pooled, weights_.dense_weight, weights_.dense_bias,
                           WeightLayout::InOut, acts_.head});
  backend_.matmul_forward({acts_.logits, acts_.head, weights_.out_weight, weights_.out_bias});
  if (!inputs_.targets) return;
  const bool training = inputs_.gradients != GradientPass::None;
  // The logits stay for logits(); the loss writes their gradient over them only in training.
  backend_.softmax_cross_entropy({acts_.logits, acts_.losses, acts_.labels, config_.num_labels, kUncountedTarget,
                                  inputs_.gradient_scale, training});
}

double EncoderClassifier::loss() {
  if (!inputs_.targets || counted_ == 0) return 0.0;
  std::vector<float> losses(static_cast<size_t>(inputs_.batch));
  backend_.copy_to_host(losses.data(), acts_.losses.data, losses.size() * sizeof(float));
  double sum = 0.0;
  for (const float loss : losses) sum += loss;  // 0 where the label does not count (ops.h)
  return sum / static_cast<double>(counted_);
}

void EncoderClassifier::backward() {
  KILN_CHECK(backward_ready_, "EncoderClassifier::backward without a preceding training forward");
  backward_ready_ = false;
  const GradStore store = grad_store();
  const Weights& w = weights_;
  const Weights& g = weight_grads_;
  // The head: acts_.logits holds d(loss)/d logits.
  backend_.matmul_backward({acts_.d_head, g.out_weight, g.out_bias, acts_.logits, acts_.head, w.out_weight,
                            WeightLayout::InOut, acts_.head_pre, nullptr, {}, store});
  backend_.matmul_backward({acts_.d_pooled, g.dense_weight, g.dense_bias, acts_.d_head, acts_.pooled, w.dense_weight,
                            WeightLayout::InOut, {}, nullptr, {}, store});
  backend_.tanh_backward({acts_.d_pooled, acts_.pooled, acts_.d_pooled});
  backend_.matmul_backward({acts_.d_first, g.pooler_weight, g.pooler_bias, acts_.d_pooled, acts_.first,
                            w.pooler_weight, WeightLayout::InOut, {}, nullptr, {}, store});
  backend_.gather_rows_backward({acts_.d_hidden, acts_.d_first, 0, GradStore::Write});
  backend_.mask_rows({acts_.d_hidden, acts_.d_hidden, acts_.key_mask});  // the mask's backward: none at padding
  const int64_t L = config_.num_layers, J = config_.num_intermediate_layers;
  const Tensor blocks_output = L ? acts_.stack.blocks[static_cast<size_t>(L - 1)].residual_out : acts_.embedded;
  const Tensor last = J ? acts_.intermediate_out[static_cast<size_t>(J - 1)] : blocks_output;
  const BlockStackPass stack = blocks();
  // With fp8 and no intermediate layers, the final LayerNorm's backward also casts the last block's
  // output gradient for its MLP c_proj (block.h); through intermediate layers it arrives uncast.
  const Fp8GradientReader reader =
      final_norm_casts_blocks_gradient(config_) ? input_gradient_reader(stack, g.blocks, L) : Fp8GradientReader{};
  backend_.layernorm_backward(layernorm_backward_feeding({acts_.d_residual, g.lnf_weight, g.lnf_bias, acts_.d_hidden,
                                                          last, w.lnf_weight, acts_.lnf_mean, acts_.lnf_rstd, store,
                                                          GradStore::Write},
                                                         reader, acts_.d_residual_fp8));
  announce_final(g.lnf_weight);  // the head's, the pooler's and the final LayerNorm's
  for (int64_t j = J - 1; j >= 0; --j) {  // y = x + dropout(gelu(x W + b)); d_residual holds dy
    const auto index = static_cast<size_t>(j);
    const Tensor input = j ? acts_.intermediate_out[index - 1] : blocks_output;
    backend_.dropout(branch_dropout(acts_.branch, acts_.d_residual, L + j, DropoutSite::MlpOutput));
    backend_.gelu_backward({acts_.branch, acts_.intermediate_pre[index], acts_.branch});
    backend_.matmul_backward({acts_.d_hidden, g.intermediate_weight[index], g.intermediate_bias[index], acts_.branch,
                              input, w.intermediate_weight[index], WeightLayout::InOut, {}, nullptr, {}, store});
    backend_.dropout({acts_.d_residual, acts_.d_hidden, 0.0f, 0, 0, acts_.d_residual});  // dx = dy + the branch's
    announce_final(g.intermediate_weight[index]);
  }
  block_stack_backward(backend_, stack, g.blocks, acts_.embedded,
                       BlockScratch{acts_.d_hidden, acts_.d_qkv, acts_.d_fc, acts_.d_residual_fp8}, acts_.d_residual, store,
                       [this](const Tensor& first) { announce_final(first); });
  if (drops_hidden()) backend_.dropout(branch_dropout(acts_.d_residual, acts_.d_residual, 0, DropoutSite::Embedding));
  // The forward's two lookups backwards: the words' and then what the positions added (fp32 sums
  // over the samples, so the positions' gradients are never rounded to the compute dtype). A lookup
  // only adds to its table's gradient (ops.h): a writing pass clears the words' first. The
  // token types' table is held (encoder_classifier.h): its gradient stays zero.
  if (store == GradStore::Write) backend_.fill({g.wte, 0.0f});
  backend_.embedding_backward({g.wte, acts_.d_placed, acts_.d_residual, acts_.tokens, GradStore::Write});
  backend_.embedding_backward({g.wtt, g.wpe, acts_.d_placed.reshaped({1, acts_.seq, config_.hidden_size}),
                               acts_.token_types, store});
  backend_.fill({g.wtt, 0.0f});
  announce_final(g.wte);
}

std::vector<float> EncoderClassifier::logits() {
  KILN_CHECK(acts_.batch > 0, "EncoderClassifier::logits before a forward");
  KILN_CHECK(!logits_hold_gradient_,
             "EncoderClassifier::logits after a training forward: its loss wrote the logits' gradient over them");
  const int64_t count = acts_.batch * config_.num_labels;
  std::vector<char> stored(static_cast<size_t>(count) * dtype_size(acts_.logits.dtype));
  backend_.copy_to_host(stored.data(), acts_.logits.data, stored.size());
  std::vector<float> values(static_cast<size_t>(count));
  widen_to_fp32(stored.data(), acts_.logits.dtype, values.data(), count);
  return values;
}

void EncoderClassifier::count_predictions(ConfusionMatrix& counts) {
  const std::vector<int32_t> predicted = predictions();
  KILN_CHECK(labels_.size() == predicted.size(), "count_predictions after a forward without labels");
  for (size_t i = 0; i < predicted.size(); ++i)
    if (labels_[i] != kUncountedTarget) counts.add(labels_[i], predicted[i]);
}

std::vector<int32_t> EncoderClassifier::predictions() {
  const std::vector<float> values = logits();
  const auto labels = static_cast<size_t>(config_.num_labels);
  std::vector<int32_t> predicted;
  for (size_t row = 0; row < values.size() / labels; ++row) {
    const auto first = values.begin() + static_cast<std::ptrdiff_t>(row * labels);
    predicted.push_back(static_cast<int32_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(labels)) - first));
  }
  return predicted;
}

std::string EncoderArchitecture::describe() const {
  return fmt::format(
      "encoder classifier: {} layers, hidden {}, {} heads, {} intermediate layers, {} labels, vocabulary {} (padded "
      "{}), {} positions, hidden dropout {:g}, attention dropout {:g}: {} parameters",
      config_.num_layers, config_.hidden_size, config_.num_heads, config_.num_intermediate_layers, config_.num_labels,
      config_.vocab_size, config_.padded_vocab_size(), config_.max_position_embeddings, config_.hidden_dropout,
      config_.attention_dropout, num_parameters());
}

size_t EncoderArchitecture::activation_bytes(int64_t batch, int64_t seq, const RecomputePolicy& policy, DType dtype,
                                             int64_t /*logit_rows*/, const Fp8Recipe* fp8) const {
  return EncoderActivations::bytes_needed(config_, batch, seq, dtype, policy, fp8 != nullptr);
}

Backend::WorkspaceNeeds EncoderArchitecture::workspace_needs(int64_t batch, int64_t seq, DType dtype,
                                                             const Fp8Recipe* fp8, int64_t /*logit_rows*/) const {
  return EncoderClassifier::workspace_needs(config_, batch, seq, dtype, fp8);
}

double EncoderArchitecture::closed_form_parameters() const {
  return encoder_closed_form_parameters(config_.num_layers, config_.hidden_size, config_.vocab_size,
                                        config_.max_position_embeddings, config_.num_intermediate_layers,
                                        config_.num_labels);
}

double EncoderArchitecture::flops_per_iteration(int64_t global_batch, int64_t seq, bool full_recompute) const {
  return encoder_flops_per_iteration(EncoderFlopsShape{global_batch, seq, config_.num_layers, config_.hidden_size,
                                                       config_.num_intermediate_layers, config_.num_labels},
                                     full_recompute);
}

}  // namespace kiln
