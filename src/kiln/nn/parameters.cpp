#include "kiln/nn/parameters.h"

#include <fmt/format.h>

#include "kiln/core/error.h"

namespace kiln {

namespace {

Tensor flat_view(const DeviceBuffer& buffer, int64_t count, DType dtype, Device device) {
  Tensor tensor;
  tensor.data = buffer.data();
  tensor.shape = Shape{count};
  tensor.dtype = dtype;
  tensor.device = device;
  return tensor;
}

}  // namespace

FlatParameters::FlatParameters(Backend& backend, int64_t count, DType dtype, int64_t flat_multiple) {
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "model parameters must be fp32, bf16 or fp16, not {}", dtype_name(dtype));
  KILN_CHECK(flat_multiple >= 1, "flat buffers padded to a multiple of {}", flat_multiple);
  const int64_t padded = (count + flat_multiple - 1) / flat_multiple * flat_multiple;
  param_buffer = backend.allocate(static_cast<size_t>(padded) * dtype_size(dtype));
  grad_buffer = backend.allocate(static_cast<size_t>(padded) * sizeof(float));
  padded_params = flat_view(*param_buffer, padded, dtype, backend.device());
  padded_grads = flat_view(*grad_buffer, padded, DType::F32, backend.device());
  params = padded_params.slice(0, count);
  grads = padded_grads.slice(0, count);
  backend.fill({padded_grads, 0.0f});
  if (padded > count) {  // the parameters' padding: zero, and never written again but by a gather
    const std::vector<char> zeros(static_cast<size_t>(padded - count) * dtype_size(dtype), 0);
    backend.copy_to_device(static_cast<char*>(padded_params.data) + params.bytes(), zeros.data(), zeros.size());
  }
}

void FlatParameters::set(Backend& backend, std::span<const float> values) const {
  KILN_CHECK(static_cast<int64_t>(values.size()) == params.numel(), "{} parameter values given, the model has {}",
             values.size(), params.numel());
  std::vector<char> rounded(params.bytes());
  narrow_from_fp32(values.data(), params.dtype, rounded.data(), params.numel());
  backend.copy_to_device(params.data, rounded.data(), rounded.size());
}

ParameterLayout::ParameterLayout(const GptConfig& config) {
  const int64_t C = config.hidden_size;
  add("wte.weight", {config.padded_vocab_size(), C}, true);
  add("wpe.weight", {config.max_position_embeddings, C}, true);
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = fmt::format("h.{}.", layer);
    add(prefix + "ln_1.weight", {C}, false);
    add(prefix + "ln_1.bias", {C}, false);
    add(prefix + "attn.c_attn.weight", {C, 3 * C}, true);
    add(prefix + "attn.c_attn.bias", {3 * C}, false);
    add(prefix + "attn.c_proj.weight", {C, C}, true);
    add(prefix + "attn.c_proj.bias", {C}, false);
    add(prefix + "ln_2.weight", {C}, false);
    add(prefix + "ln_2.bias", {C}, false);
    add(prefix + "mlp.c_fc.weight", {C, 4 * C}, true);
    add(prefix + "mlp.c_fc.bias", {4 * C}, false);
    add(prefix + "mlp.c_proj.weight", {4 * C, C}, true);
    add(prefix + "mlp.c_proj.bias", {C}, false);
  }
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
}

void ParameterLayout::add(std::string name, Shape shape, bool weight_decay) {
  const int64_t count = shape.numel();
  entries_.push_back({std::move(name), shape, total_, weight_decay});
  total_ += count;
}

const ParameterInfo& ParameterLayout::find(std::string_view name) const {
  for (const ParameterInfo& entry : entries_)
    if (entry.name == name) return entry;
  fail("model has no parameter named '{}'", name);
}

Tensor ParameterLayout::view(const Tensor& flat, std::string_view name) const {
  const ParameterInfo& info = find(name);
  return flat.slice(info.offset, info.shape.numel()).reshaped(info.shape);
}

std::vector<AdamwSegment> ParameterLayout::adamw_segments(float weight_decay) const {
  std::vector<AdamwSegment> segments;
  for (const ParameterInfo& entry : entries_) {
    const float decay = entry.weight_decay ? weight_decay : 0.0f;
    if (!segments.empty() && segments.back().weight_decay == decay) {
      segments.back().count += entry.shape.numel();
    } else {
      segments.push_back({entry.offset, entry.shape.numel(), decay});
    }
  }
  return segments;
}

GptWeights GptWeights::bind(const ParameterLayout& layout, const GptConfig& config, Tensor flat) {
  KILN_CHECK(flat.numel() == layout.total(), "flat buffer has {} elements, layout needs {}",
             flat.numel(), layout.total());
  auto view = [&](const std::string& name) { return layout.view(flat, name); };
  GptWeights weights;
  weights.wte = view("wte.weight");
  weights.wpe = view("wpe.weight");
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = fmt::format("h.{}.", layer);
    weights.blocks.push_back(BlockWeights{
        view(prefix + "ln_1.weight"), view(prefix + "ln_1.bias"),
        view(prefix + "attn.c_attn.weight"), view(prefix + "attn.c_attn.bias"),
        view(prefix + "attn.c_proj.weight"), view(prefix + "attn.c_proj.bias"),
        view(prefix + "ln_2.weight"), view(prefix + "ln_2.bias"),
        view(prefix + "mlp.c_fc.weight"), view(prefix + "mlp.c_fc.bias"),
        view(prefix + "mlp.c_proj.weight"), view(prefix + "mlp.c_proj.bias")});
  }
  weights.lnf_weight = view("ln_f.weight");
  weights.lnf_bias = view("ln_f.bias");
  return weights;
}

}  // namespace kiln
