#include "kiln/nn/gpt_config.h"

#include <fmt/format.h>

#include "kiln/core/error.h"

namespace kiln {

void GptConfig::validate() const {
  KILN_CHECK(num_layers > 0, "num_layers must be positive, got {}", num_layers);
  KILN_CHECK(hidden_size > 0, "hidden_size must be positive, got {}", hidden_size);
  KILN_CHECK(num_heads > 0, "num_attention_heads must be positive, got {}", num_heads);
  KILN_CHECK(hidden_size % num_heads == 0,
             "num_attention_heads {} does not divide hidden_size {}", num_heads, hidden_size);
  KILN_CHECK(vocab_size > 0, "vocab_size must be positive, got {}", vocab_size);
  KILN_CHECK(max_position_embeddings > 0, "max_position_embeddings must be positive, got {}",
             max_position_embeddings);
  KILN_CHECK(init_method_std > 0.0f, "init_method_std must be positive, got {}", init_method_std);
  KILN_CHECK(hidden_dropout >= 0.0f && hidden_dropout < 1.0f, "hidden_dropout must be in [0, 1), got {}",
             hidden_dropout);
  KILN_CHECK(attention_dropout >= 0.0f && attention_dropout < 1.0f, "attention_dropout must be in [0, 1), got {}",
             attention_dropout);
}

std::string beyond_size_limits(int64_t num_layers, int64_t hidden_size, int64_t num_heads, int64_t vocab_size,
                               int64_t seq_length, int64_t micro_batch_size) {
  if (num_layers > kMaxLayers) return fmt::format("{} layers (at most {})", num_layers, kMaxLayers);
  const double layers = static_cast<double>(num_layers), hidden = static_cast<double>(hidden_size),
               heads = static_cast<double>(num_heads), vocab = static_cast<double>(vocab_size),
               seq = static_cast<double>(seq_length), batch = static_cast<double>(micro_batch_size);
  const std::pair<const char*, double> tensors[] = {
      {"parameters (12 x layers x hidden^2 + (vocab + seq) x hidden)",
       12 * layers * hidden * hidden + (vocab + seq) * hidden},
      {"the MLP activation (4 x micro-batch x seq x hidden)", 4 * batch * seq * hidden},
      {"the logits (micro-batch x seq x vocab)", batch * seq * vocab},
      {"the attention scores (micro-batch x heads x seq^2)", batch * heads * seq * seq}};
  for (const auto& [name, elements] : tensors)
    if (elements > kMaxTensorElements) return fmt::format("{}: {:.3g} elements (at most 2^53)", name, elements);
  return "";
}

}  // namespace kiln
