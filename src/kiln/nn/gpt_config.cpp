#include "kiln/nn/gpt_config.h"

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
}

}  // namespace kiln
