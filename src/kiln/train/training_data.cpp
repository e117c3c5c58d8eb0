#include "kiln/train/training_data.h"

#include <fmt/format.h>

#include <optional>

#include "kiln/core/error.h"
#include "kiln/data/classification_csv.h"
#include "kiln/data/classification_tokens.h"
#include "kiln/data/gpt_dataset.h"
#include "kiln/data/token_dataset.h"

namespace kiln {
namespace {

constexpr uint64_t kValidationSeedSalt = 0x76616c6964ull;  // "valid": validation samples differ from training ones

bool is_text_file(const std::string& path) { return path.ends_with(".jsonl") || path.ends_with(".csv"); }

// The first of `dir`/stem.jsonl and `dir`/stem.csv that exists; "" if neither.
std::string text_file_in(const std::string& dir, const std::string& stem, const Storage& storage) {
  for (const char* extension : {".jsonl", ".csv"})
    if (const std::string path = dir + "/" + stem + extension; storage.exists(path)) return path;
  return {};
}

// Where a classification run's samples are.
struct ClassificationPaths {
  std::string train, validation;  // validation "": none
  bool pretokenized = false;      // classification CSV with metadata.json
};

ClassificationPaths find_classification_data(const std::string& data_path, const Storage& storage) {
  if (is_text_file(data_path)) return {data_path, {}, false};
  if (storage.exists(data_path + "/metadata.json")) return {data_path, {}, true};
  ClassificationPaths paths{text_file_in(data_path, "train", storage), text_file_in(data_path, "validation", storage),
                            false};
  KILN_CHECK(!paths.train.empty(),
             "config key 'data_path': '{}' holds no classification data: expected train.jsonl or train.csv (and "
             "validation.jsonl or validation.csv) in it, a .jsonl or .csv file, or a folder of pre-tokenized CSV with "
             "metadata.json (`kiln data synth`)",
             data_path);
  return paths;
}

std::unique_ptr<Gpt2Tokenizer> open_tokenizer(const Config& config) {
  if (!config.vocab_file.empty()) return std::make_unique<Gpt2Tokenizer>(config.vocab_file, config.merge_file);
  return std::make_unique<Gpt2Tokenizer>(default_gpt2_tokenizer_dir());
}

// Raw text's ids are the tokenizer's, anywhere in its vocabulary (the padding id, <|endoftext|>,
// is its last): a model with fewer word embeddings could not look them up.
void check_vocabulary_holds_tokenizer(const Config& config, const Gpt2Tokenizer& tokenizer) {
  KILN_CHECK(config.vocab_size >= tokenizer.vocab_size(),
             "--vocab-size {} is smaller than the vocabulary of GPT-2's tokenizer ({} ids), which tokenizes the text "
             "of data_path '{}': the model could not embed its ids; leave --vocab-size out (0: the tokenizer's) or set "
             "it to at least {}",
             config.vocab_size, tokenizer.vocab_size(), config.data_path, tokenizer.vocab_size());
}

TrainingData open_next_tokens(const Config& config) {
  const auto seed = static_cast<uint64_t>(config.seed);
  const Storage storage(config.storage_options());
  const int64_t vocab = config.vocab_size, seq = config.seq_length;
  const bool validating = config.eval_iters > 0;
  TrainingData data;
  if (config.mock_data) {
    data.train = std::make_unique<MockTokens>(vocab, seq, seed);
    if (validating) data.validation = std::make_unique<MockTokens>(vocab, seq, seed ^ kValidationSeedSalt);
    data.description = "random tokens (mock data)";
  } else if (is_indexed_data_path(config.data_path, storage)) {
    data.train = make_gpt_data(config.data_path, config.split, DataSplit::Train, vocab, seq,
                               config.train_iters * config.global_batch_size, seed, storage);
    // Every validation reads the same eval_iters global batches, or the split's samples once.
    if (validating)
      data.validation = make_gpt_data(
          config.data_path, config.split, DataSplit::Validation, vocab, seq,
          config.eval_whole_split ? GptDataset::kWholeSplit : config.eval_iters * config.global_batch_size, seed,
          storage);
    data.description = fmt::format("indexed data '{}', split {}, {} train tokens per epoch{}", config.data_path,
                                   config.split, data.train->num_tokens(),
                                   config.eval_whole_split && data.validation
                                       ? fmt::format("; validation: the split's {} samples of {} tokens",
                                                     *data.validation->distinct_samples(), seq)
                                       : std::string());
  } else {
    auto train = std::make_unique<TokenDataset>(config.data_path, "train", vocab, seq, seed, storage);
    data.description = fmt::format("{} train tokens in {} shards", train->num_tokens(), train->num_shards());
    data.train = std::move(train);
    if (validating)
      data.validation =
          std::make_unique<TokenDataset>(config.data_path, "val", vocab, seq, seed ^ kValidationSeedSalt, storage);
  }
  return data;
}

TrainingData open_labelled_sequences(const Config& config) {
  const auto seed = static_cast<uint64_t>(config.seed);
  const Storage storage(config.storage_options());
  const int64_t seq = config.seq_length, labels = config.num_labels;
  const bool validating = config.eval_iters > 0;
  TrainingData data;
  if (config.mock_data) {
    data.train = make_mock_classification_tokens(config.vocab_size, seq, labels, seed);
    if (validating)
      data.validation = make_mock_classification_tokens(config.vocab_size, seq, labels, seed ^ kValidationSeedSalt);
    data.description = "random labelled sequences (mock data)";
    return data;
  }
  const ClassificationPaths paths = find_classification_data(config.data_path, storage);
  KILN_CHECK(!validating || !paths.validation.empty(),
             "config key 'data_path': '{}' has no validation samples (validation.jsonl or validation.csv beside "
             "train.*), but eval_iters is {}; add them or set --eval-iters 0",
             config.data_path, config.eval_iters);
  if (paths.pretokenized) {
    data.train = open_classification_csv_tokens(paths.train, seq, labels, config.vocab_size, seed, storage);
    data.description = fmt::format("pre-tokenized classification CSV '{}', {} samples of {} tokens", paths.train,
                                   data.train->num_tokens() / seq, seq);
    return data;
  }
  data.tokenizer = open_tokenizer(config);
  check_vocabulary_holds_tokenizer(config, *data.tokenizer);
  const TextClassificationOptions options{config.text_key, config.label_key, seq, labels};
  data.train = open_text_classification_tokens(paths.train, *data.tokenizer, options, seed, storage);
  if (validating)
    data.validation = open_text_classification_tokens(paths.validation, *data.tokenizer, options,
                                                      seed ^ kValidationSeedSalt, storage);
  data.description = fmt::format("text '{}' ({} samples{}), GPT-2 tokens truncated and padded to {}", paths.train,
                                 data.train->num_tokens() / seq,
                                 data.validation ? fmt::format("; validation '{}', {} samples", paths.validation,
                                                               data.validation->num_tokens() / seq)
                                                 : std::string(),
                                 seq);
  return data;
}

}  // namespace

TrainingData open_training_data(const Config& config, ModelInput input) {
  KILN_CHECK(config.mock_data || !config.data_path.empty(),
             "config key 'data_path' is not set: no training data (or use --mock-data)");
  TrainingData data = input == ModelInput::NextTokens ? open_next_tokens(config) : open_labelled_sequences(config);
  KILN_CHECK(!config.eval_whole_split || !data.validation || data.validation->distinct_samples(),
             "config key 'eval_whole_split' is set, but the validation samples of {} are drawn without end (no "
             "fixed set to read once); leave it out and set --eval-iters, the batches each validation reads",
             data.description);
  return data;
}

int64_t data_vocab_size(const Config& config, ModelInput input) {
  KILN_CHECK(!config.mock_data,
             "config key 'vocab_size' must be set with mock_data (there is no data to read it from)");
  KILN_CHECK(!config.data_path.empty(), "config key 'vocab_size' is 0 (take it from the data) but no data_path is set");
  const Storage storage(config.storage_options());
  if (input == ModelInput::LabelledSequences) {
    const ClassificationPaths paths = find_classification_data(config.data_path, storage);
    if (paths.pretokenized) return ClassificationDataset(paths.train, storage).vocab_size();
    return open_tokenizer(config)->vocab_size();
  }
  if (is_indexed_data_path(config.data_path, storage)) {
    KILN_CHECK(!config.vocab_file.empty(),
               "config key 'vocab_size' is 0 and data_path names Megatron indexed data, which does not record it; "
               "set --vocab-size (50257 for GPT-2 tokens)");
    return config.tokenizer_vocab_size();  // Megatron's way: the tokenizer's vocabulary
  }
  const std::optional<int64_t> from_data = read_data_vocab_size(config.data_path, storage);
  KILN_CHECK(from_data.has_value(), "config key 'vocab_size' is 0 and '{}/meta.json' does not exist; set --vocab-size",
             config.data_path);
  return *from_data;
}

}  // namespace kiln
