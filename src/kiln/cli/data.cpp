// `kiln data prepare-text`: UTF-8 text -> byte-level token shards with a train/validation split.
// `kiln data tokenize`: GPT-2 BPE ids of standard input (or, with --decode, text from ids).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/prepare_text.h"

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
    fmt::print("prepared {} documents: train {} documents, {} tokens | validation {} documents, {} tokens\n",
               summary.documents, summary.train_documents, summary.train_tokens, summary.val_documents,
               summary.val_tokens);
    for (const std::string& shard : summary.shards) fmt::print("  wrote {}\n", shard);
  });

  struct TokenizeOptions {
    std::string dir;
    bool decode = false;
  };
  auto tokenize_options = std::make_shared<TokenizeOptions>();
  const char* from_environment = std::getenv("KILN_GPT2_TOKENIZER_DIR");
  tokenize_options->dir = from_environment ? from_environment : KILN_DEFAULT_TOKENIZER_DIR;
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
