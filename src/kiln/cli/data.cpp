// `kiln data prepare-text`: UTF-8 text -> byte-level token shards with a train/validation split.
#include <fmt/format.h>

#include <memory>

#include "kiln/cli/commands.h"
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
}

}  // namespace kiln::cli
