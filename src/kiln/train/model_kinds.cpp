#include "kiln/train/model_kinds.h"

#include "kiln/core/error.h"
#include "kiln/nn/encoder_classifier.h"
#include "kiln/nn/gpt.h"
#include "kiln/train/config.h"

namespace kiln {

EncoderConfig encoder_config(const Config& config) {
  EncoderConfig encoder;
  encoder.num_layers = config.num_layers;
  encoder.hidden_size = config.hidden_size;
  encoder.num_heads = config.num_attention_heads;
  encoder.vocab_size = config.vocab_size > 0 ? config.vocab_size : 1;
  encoder.max_position_embeddings = config.max_position_embeddings;
  encoder.num_intermediate_layers = config.num_intermediate_layers;
  encoder.num_labels = config.num_labels;
  encoder.init_method_std = static_cast<float>(config.init_method_std);
  encoder.hidden_dropout = static_cast<float>(config.resolved_hidden_dropout());
  encoder.attention_dropout = static_cast<float>(config.resolved_attention_dropout());
  return encoder;
}

const std::vector<ModelKind>& model_kinds() {
  static const std::vector<ModelKind> kinds = {
      {"gpt", "GPT-2 causal language model", ModelInput::NextTokens, 0.0, 0.0,
       [](const Config& config) -> std::unique_ptr<ModelArchitecture> {
         return std::make_unique<GptArchitecture>(config.gpt());
       }},
      {"encoder-classifier", "BERT-like sequence classifier (the seed lab's model)", ModelInput::LabelledSequences,
       0.1, 0.1,  // the lab's model's rates
       [](const Config& config) -> std::unique_ptr<ModelArchitecture> {
         return std::make_unique<EncoderArchitecture>(encoder_config(config));
       }},
  };
  return kinds;
}

const ModelKind& model_kind(const std::string& name) {
  std::string known;
  for (const ModelKind& kind : model_kinds()) {
    if (kind.name == name) return kind;
    known += known.empty() ? kind.name : std::string(", ") + kind.name;
  }
  fail("config key 'model': '{}' is not a model kiln builds (models: {})", name, known);
}

}  // namespace kiln
