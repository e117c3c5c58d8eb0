// The samples a run trains and validates on (data/token_source.h), opened from its Config for what
// its model reads (nn/model.h, ModelInput):
//   next tokens (GPT)      --mock-data; data_path a Megatron indexed dataset (a prefix) or kiln's
//                          token shards (a folder with meta.json)
//   labelled sequences     --mock-data; data_path one of
//   (encoder-classifier)     a folder holding train.jsonl or train.csv, and validation.jsonl or
//                            validation.csv (what `kiln data spam-assassin` writes);
//                            a single .jsonl or .csv file: training samples only;
//                            a folder of pre-tokenized CSV with metadata.json (`kiln data synth`):
//                            training samples only.
//                          Raw text is tokenized by the loader's workers with GPT-2's BPE
//                          (vocab_file and merge_file when set, else the files `make` installs),
//                          truncated and padded to seq_length (data/text_classification.h);
//                          a vocab_size below the tokenizer's vocabulary is refused at once,
//                          naming --vocab-size and both sizes.
// Validation samples are seeded apart from training ones. With eval_iters > 0 and no validation
// data the run stops at start, naming data_path; so does eval_whole_split over samples drawn
// without end (mock data, token shards, a blend of indexed datasets), naming the data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/token_source.h"
#include "kiln/nn/model.h"
#include "kiln/train/config.h"

namespace kiln {

struct TrainingData {
  std::unique_ptr<Gpt2Tokenizer> tokenizer;  // for raw text; declared first, so it outlives the sources
  std::unique_ptr<TokenSource> train, validation;  // validation null when eval_iters is 0
  std::string description;  // for the run's log: what the samples are
};

// `config` resolved (vocab_size known).
TrainingData open_training_data(const Config& config, ModelInput input);

// The vocabulary the data implies, for a config whose vocab_size is 0 (resolve_config); an error
// naming the key when the data cannot tell.
int64_t data_vocab_size(const Config& config, ModelInput input);

}  // namespace kiln
