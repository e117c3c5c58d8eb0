// Where every GPT parameter lives in the flat buffers (ARCHITECTURE.md decision 3).
//
// ParameterLayout lists each tensor once, under its Hugging Face GPT-2 name (wte.weight,
// h.0.attn.c_attn.weight, ...), with its shape, its element offset in the flat buffer and
// whether weight decay applies (2-D matrices yes; biases and LayerNorm no). Linear weights use
// HF's Conv1D layout [in, out]. wte is stored with padded_vocab_size rows.
// The same layout indexes parameters, gradients, master weights and both Adam moments, so
// GptWeights::bind() gives named views into any of those buffers.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/ops.h"
#include "kiln/core/tensor.h"
#include "kiln/nn/gpt_config.h"

namespace kiln {

struct ParameterInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;
  bool weight_decay = false;
};

class ParameterLayout {
 public:
  ParameterLayout() = default;  // empty; a model's layout is built with add()
  explicit ParameterLayout(const GptConfig& config);

  const std::vector<ParameterInfo>& entries() const { return entries_; }
  int64_t total() const { return total_; }
  const ParameterInfo& find(std::string_view name) const;  // throws naming the missing tensor
  // Maximal runs of neighbouring tensors with the same decay flag, for one fused AdamW pass.
  std::vector<AdamwSegment> adamw_segments(float weight_decay) const;
  // Appends a tensor after the last one.
  void add(std::string name, Shape shape, bool weight_decay);
  // A view of `name` in `flat`, a buffer laid out by this layout (elements of its dtype).
  Tensor view(const Tensor& flat, std::string_view name) const;

 private:
  std::vector<ParameterInfo> entries_;
  int64_t total_ = 0;
};

// A model's flat parameter and gradient buffers (ARCHITECTURE.md decision 3) in the back-end's
// memory: parameters in the compute dtype (fp32, bf16 or fp16), gradients fp32, both `count`
// elements rounded up to a multiple of `flat_multiple` (the ZeRO shards' equal split). The padding
// is zero and belongs to no parameter; the gradients start at zero.
struct FlatParameters {
  FlatParameters(Backend& backend, int64_t count, DType dtype, int64_t flat_multiple);
  // Every parameter from fp32 `values` (count of them, in layout order), rounded to the dtype.
  void set(Backend& backend, std::span<const float> values) const;
  std::unique_ptr<DeviceBuffer> param_buffer, grad_buffer;
  Tensor params, grads;                // the `count` elements
  Tensor padded_params, padded_grads;  // with the padding
};

struct BlockWeights {
  Tensor ln1_weight, ln1_bias;
  Tensor qkv_weight, qkv_bias;              // attn.c_attn: [C, 3C], [3C]
  Tensor attn_proj_weight, attn_proj_bias;  // attn.c_proj: [C, C], [C]
  Tensor ln2_weight, ln2_bias;
  Tensor fc_weight, fc_bias;                // mlp.c_fc: [C, 4C], [4C]
  Tensor fc_proj_weight, fc_proj_bias;      // mlp.c_proj: [4C, C], [C]
};

struct GptWeights {
  Tensor wte, wpe;
  std::vector<BlockWeights> blocks;
  Tensor lnf_weight, lnf_bias;

  // Named views into a flat buffer laid out by `layout` (elements of the buffer's dtype).
  static GptWeights bind(const ParameterLayout& layout, const GptConfig& config, Tensor flat);
};

}  // namespace kiln
