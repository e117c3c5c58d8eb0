// `kiln classify`: load an encoder-classifier checkpoint and label texts with it: the rows of data
// (--data-path, read and tokenized by TextClassificationDataset exactly as training reads them,
// except that a file's rows may all be unlabelled; one that mixes labelled and unlabelled rows is
// refused naming the file and row) and texts given on the command line (--text). Each text gets
// its predicted label, the softmax probability of every label and the start of what the model
// read; with labelled rows, the accuracy over them closes the table (or the JSON document, with
// --json); without, there is no accuracy.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/prepare_text.h"
#include "kiln/data/text_classification.h"
#include "kiln/nn/encoder_classifier.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/model_kinds.h"

namespace kiln::cli {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written

constexpr size_t kExcerptCharacters = 70;

struct ClassifyOptions {
  std::string load;
  std::string data_path;
  std::vector<std::string> texts;
  int64_t samples = 0;  // the first rows of data_path; 0: all of them
  std::string device = "cpu";
  bool json = false;
};

// One text as the model reads it, and what is shown of it.
struct Item {
  std::string source;  // "row 3" of the data, or "--text 1"
  ClassificationSample sample;
  std::optional<int32_t> label;  // the true label, known for rows of labelled data
  std::string excerpt;
};

struct Prediction {
  int32_t label = 0;
  std::vector<double> probabilities;  // one per label, summing to 1
};

bool is_utf8_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The first kExcerptCharacters code points of `text` on one line: every run of whitespace and
// control characters becomes one space; "..." follows when the text was cut here or `continues`.
std::string excerpt_of(std::string_view text, bool continues) {
  std::string line;
  size_t characters = 0;
  bool cut = false;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool blank = byte <= ' ' || byte == 0x7f;
    if (blank) {
      if (!line.empty() && line.back() != ' ') line += ' ';
      continue;
    }
    if (!is_utf8_continuation(c)) {
      if (characters == kExcerptCharacters) {
        cut = true;
        break;
      }
      ++characters;
    }
    line += c;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  if (cut || continues) line += "...";
  return line;
}

// `text` as training makes a sample of it (data/text_classification.h): its GPT-2 ids truncated
// to `seq` and padded with kPadId, the mask 1 on real tokens. The whole text's ids truncated equal
// the ids of the prefix the dataset tokenizes, by that prefix's contract.
ClassificationSample sample_of_text(const Gpt2Tokenizer& tokenizer, const std::string& text,
                                    int64_t seq) {
  const auto length = static_cast<size_t>(seq);
  ClassificationSample sample;
  sample.input_ids = tokenizer.encode(text);
  const size_t used = std::min(sample.input_ids.size(), length);
  sample.input_ids.resize(length, TextClassificationDataset::kPadId);
  sample.attention_mask.assign(length, 0);
  std::fill_n(sample.attention_mask.begin(), used, 1);
  return sample;
}

// The rows of `options.data_path` to show, then the --text texts, in that order.
std::vector<Item> read_items(const ClassifyOptions& options, const Config& config,
                             const Gpt2Tokenizer& tokenizer) {
  std::vector<Item> items;
  if (!options.data_path.empty()) {
    TextClassificationOptions text_options{config.text_key, config.label_key, config.seq_length,
                                           config.num_labels};
    text_options.labels_required = false;
    const TextClassificationDataset data(options.data_path, tokenizer, text_options);
    const int64_t rows = options.samples > 0 ? std::min(options.samples, data.size()) : data.size();
    for (int64_t row = 0; row < rows; ++row) {
      ClassificationSample sample = data.sample(row);
      const auto used = static_cast<size_t>(
          std::count(sample.attention_mask.begin(), sample.attention_mask.end(), 1));
      // The excerpt is the start of what the model read: the decoded real ids, less a character
      // the truncation split.
      std::string read = tokenizer.decode(std::span(sample.input_ids).first(used));
      if (const int64_t bad = find_invalid_utf8(read); bad >= 0)
        read.resize(static_cast<size_t>(bad));
      std::string excerpt = excerpt_of(read, used == sample.input_ids.size());
      const std::optional<int32_t> label = sample.label == TextClassificationDataset::kNoLabel
                                               ? std::nullopt
                                               : std::optional(sample.label);
      items.push_back(
          Item{fmt::format("row {}", row + 1), std::move(sample), label, std::move(excerpt)});
    }
  }
  for (size_t i = 0; i < options.texts.size(); ++i) {
    const std::string& text = options.texts[i];
    KILN_CHECK(find_invalid_utf8(text) < 0, "--text {}: not valid UTF-8", i + 1);
    Item item{fmt::format("--text {}", i + 1), sample_of_text(tokenizer, text, config.seq_length),
              std::nullopt, excerpt_of(text, false)};
    KILN_CHECK(item.sample.attention_mask.front() == 1, "--text {}: no tokens (the text is empty)",
               i + 1);
    items.push_back(std::move(item));
  }
  return items;
}

// Runs the model over `items` in micro-batches of at most `batch` texts.
std::vector<Prediction> predict(EncoderClassifier& model, const std::vector<Item>& items,
                                int64_t batch, int64_t seq) {
  const int64_t labels = model.num_labels();
  std::vector<Prediction> predictions;
  for (size_t start = 0; start < items.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(items.size(), start + static_cast<size_t>(batch));
    std::vector<int32_t> ids, mask;
    for (size_t i = start; i < end; ++i) {
      ids.insert(ids.end(), items[i].sample.input_ids.begin(), items[i].sample.input_ids.end());
      mask.insert(mask.end(), items[i].sample.attention_mask.begin(),
                  items[i].sample.attention_mask.end());
    }
    model.forward(ClassificationBatch{ids, mask, {}}, static_cast<int64_t>(end - start), seq);
    const std::vector<float> logits = model.logits();
    for (size_t row = 0; row < end - start; ++row) {
      const std::span<const float> z(logits.data() + row * static_cast<size_t>(labels),
                                     static_cast<size_t>(labels));
      const float top = *std::max_element(z.begin(), z.end());
      Prediction prediction;
      prediction.label = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
      double total = 0.0;
      for (const float value : z)
        total += prediction.probabilities.emplace_back(std::exp(double{value} - top));
      for (double& p : prediction.probabilities) p /= total;
      predictions.push_back(std::move(prediction));
    }
  }
  return predictions;
}

void print_table(const std::string& checkpoint, const Config& config,
                 const ClassifyOptions& options, const std::vector<Item>& items,
                 const std::vector<Prediction>& predictions) {
  const int64_t labels = config.num_labels;
  fmt::print("checkpoint {}: {} labels, texts cut to {} tokens\n", checkpoint, labels,
             config.seq_length);
  if (!options.data_path.empty()) fmt::print("data {}\n", options.data_path);
  std::string header = fmt::format("{:>10}  {:>9}", "text", "predicted");
  for (int64_t label = 0; label < labels; ++label)
    header += fmt::format("  {:>6}", fmt::format("p({})", label));
  fmt::print("{}  {:>4}  {:>5}  excerpt\n", header, "true", "right");
  int64_t labelled = 0, correct = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    const Prediction& prediction = predictions[i];
    std::string line = fmt::format("{:>10}  {:>9}", item.source, prediction.label);
    for (const double p : prediction.probabilities) line += fmt::format("  {:>6.4f}", p);
    std::string truth = "-", right = "-";
    if (item.label) {
      ++labelled;
      correct += *item.label == prediction.label;
      truth = std::to_string(*item.label);
      right = *item.label == prediction.label ? "yes" : "no";
    }
    fmt::print("{}  {:>4}  {:>5}  {}\n", line, truth, right, item.excerpt);
  }
  if (labelled > 0)
    fmt::print("accuracy: {:.4f} ({} of {} labelled texts)\n",
               static_cast<double>(correct) / labelled, correct, labelled);
}

void print_json(const std::string& checkpoint, const Config& config, const std::vector<Item>& items,
                const std::vector<Prediction>& predictions) {
  Json texts = Json::array();
  int64_t labelled = 0, correct = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Json text = {{"source", items[i].source},
                 {"predicted", predictions[i].label},
                 {"probabilities", predictions[i].probabilities},
                 {"label", nullptr},
                 {"excerpt", items[i].excerpt}};
    if (items[i].label) {
      text["label"] = *items[i].label;
      ++labelled;
      correct += *items[i].label == predictions[i].label;
    }
    texts.push_back(std::move(text));
  }
  const Json document = {
      {"checkpoint", checkpoint},
      {"num_labels", config.num_labels},
      {"texts", std::move(texts)},
      {"labelled", labelled},
      {"correct", correct},
      {"accuracy", labelled > 0 ? Json(static_cast<double>(correct) / labelled) : Json()}};
  fmt::print("{}\n", document.dump(2));
}

void classify(const ClassifyOptions& options) {
  KILN_CHECK(!options.data_path.empty() || !options.texts.empty(),
             "nothing to classify: give --data-path (.jsonl or .csv) or --text");
  KILN_CHECK(options.samples >= 0, "--samples must be >= 0 (0: every row), got {}",
             options.samples);
  const std::string dir = resolve_checkpoint_dir(options.load);
  const Config config = read_checkpoint_config(dir);
  const ModelKind& kind = model_kind(config.model);
  KILN_CHECK(
      kind.input == ModelInput::LabelledSequences,
      "{}: a checkpoint of model '{}' ({}), not a classifier; kiln classify loads checkpoints of "
      "--model encoder-classifier",
      dir, config.model, kind.description);
  const Gpt2Tokenizer tokenizer = config.vocab_file.empty()
                                      ? Gpt2Tokenizer(default_gpt2_tokenizer_dir())
                                      : Gpt2Tokenizer(config.vocab_file, config.merge_file);
  KILN_CHECK(
      config.vocab_size == tokenizer.vocab_size(),
      "{}: the model's vocabulary ({}) is not GPT-2's ({}): it was trained on token ids (mock or "
      "pre-tokenized data), and kiln classify reads text",
      dir, config.vocab_size, tokenizer.vocab_size());
  const std::vector<Item> items = read_items(options, config, tokenizer);

  auto backend = make_backend(options.device);
  EncoderClassifier model(encoder_config(config), *backend);
  load_model_weights(dir, model);
  model.allocate_activations(config.micro_batch_size, config.seq_length);
  const std::vector<Prediction> predictions =
      predict(model, items, config.micro_batch_size, config.seq_length);
  if (options.json)
    print_json(dir, config, items, predictions);
  else
    print_table(dir, config, options, items, predictions);
}

}  // namespace

void add_classify_command(CLI::App& root) {
  auto options = std::make_shared<ClassifyOptions>();
  CLI::App* command =
      root.add_subcommand("classify", "label texts with a trained encoder-classifier checkpoint");
  command
      ->add_option("--load", options->load, "checkpoint folder (a save folder or one iter_* in it)")
      ->required();
  command->add_option(
      "--data-path", options->data_path,
      ".jsonl or .csv (or a folder of them), labelled or not, read as training reads them");
  command->add_option("--text", options->texts, "a text to classify (repeatable)");
  command->add_option("--samples", options->samples,
                      "classify the first N rows of --data-path (0: all)");
  command->add_option("--device", options->device, "cpu or cuda");
  command->add_flag("--json", options->json, "print one JSON document instead of the table");
  command->callback([options] { classify(*options); });
}

}  // namespace kiln::cli
