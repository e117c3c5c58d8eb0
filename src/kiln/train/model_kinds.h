// The models `--model` names, in one table: what each reads, its default dropout and how its
// architecture (nn/model.h) comes from a Config. The Trainer, checkpoints, the memory check and
// `kiln estimate` go through ModelArchitecture and Model; this table is the one place that knows
// the concrete models. A new model is a row here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/encoder_config.h"
#include "kiln/nn/model.h"

namespace kiln {

struct Config;

struct ModelKind {
  const char* name;         // the value of --model
  const char* description;  // for --help and errors
  ModelInput input;
  double default_hidden_dropout;     // hidden_dropout when the config leaves it to the model (-1)
  double default_attention_dropout;  // attention_dropout likewise
  std::unique_ptr<ModelArchitecture> (*architecture)(const Config& config);
};

const std::vector<ModelKind>& model_kinds();
// The row named `name`; an error naming the key and listing the models otherwise.
const ModelKind& model_kind(const std::string& name);
// The encoder classifier's shape from a resolved Config.
EncoderConfig encoder_config(const Config& config);

}  // namespace kiln
