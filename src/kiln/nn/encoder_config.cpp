#include "kiln/nn/encoder_config.h"

#include "kiln/core/error.h"

namespace kiln {

GptConfig EncoderConfig::block_shape() const {
  GptConfig shape;
  shape.num_layers = num_layers;
  shape.hidden_size = hidden_size;
  shape.num_heads = num_heads;
  shape.vocab_size = vocab_size;
  shape.max_position_embeddings = max_position_embeddings;
  shape.init_method_std = init_method_std;
  shape.layernorm_eps = layernorm_eps;
  shape.hidden_dropout = hidden_dropout;
  shape.attention_dropout = attention_dropout;
  return shape;
}

void EncoderConfig::validate() const {
  block_shape().validate();
  // Each layer draws its own dropout streams (dropout_streams.h), blocks and intermediate layers alike.
  KILN_CHECK(num_intermediate_layers >= 0 && num_layers + num_intermediate_layers <= kMaxLayers,
             "num_intermediate_layers must be in [0, {}], got {}", kMaxLayers - num_layers, num_intermediate_layers);
  KILN_CHECK(num_labels >= 2, "num_labels must be at least 2, got {}", num_labels);
}

}  // namespace kiln
