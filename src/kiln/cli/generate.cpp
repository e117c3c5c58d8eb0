// `kiln generate`: load a checkpoint and continue a prompt, byte by byte.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/data/prepare_text.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/sampling.h"
#include "kiln/train/checkpoint.h"

namespace kiln::cli {
namespace {

struct GenerateOptions {
  std::string load;
  std::string prompt = "\n";
  int64_t max_new_tokens = 256;
  float temperature = 0.8f;
  int64_t top_k = 40;
  int64_t seed = 1234;
  std::string device = "cpu";
};

void generate(const GenerateOptions& options) {
  KILN_CHECK(options.max_new_tokens > 0, "--max-new-tokens must be positive, got {}", options.max_new_tokens);
  KILN_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0f,
             "--temperature must be a finite number >= 0 (0: greedy), got {}", options.temperature);
  KILN_CHECK(options.top_k >= 0, "--top-k must be >= 0 (0: all tokens), got {}", options.top_k);
  KILN_CHECK(!options.prompt.empty(), "--prompt must not be empty");
  const std::string dir = resolve_checkpoint_dir(options.load);
  const Config config = read_checkpoint_config(dir);
  KILN_CHECK(config.vocab_size == kByteVocabSize,
             "{}: vocabulary {} is not the byte-level one ({}); this version decodes byte-level models only",
             dir, config.vocab_size, kByteVocabSize);
  auto backend = make_backend(options.device);
  Gpt model(config.gpt(), *backend);
  load_model_weights(dir, model);
  const int64_t window = config.max_position_embeddings;
  model.allocate_activations(1, window);

  std::vector<int32_t> context;
  for (unsigned char byte : options.prompt) context.push_back(byte);
  std::fwrite(options.prompt.data(), 1, options.prompt.size(), stdout);
  Rng rng(static_cast<uint64_t>(options.seed));
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const size_t length = std::min(context.size(), static_cast<size_t>(window));
    const std::span<const int32_t> visible(context.data() + context.size() - length, length);
    model.forward(visible, {}, 1, static_cast<int64_t>(length));
    const std::vector<float> logits = model.logits_at(0, static_cast<int64_t>(length) - 1);
    const int32_t token = sample_token(logits, options.temperature, options.top_k, rng);
    if (token == kByteEndOfDocument) break;
    context.push_back(token);
    std::fputc(token, stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
}

}  // namespace

void add_generate_command(CLI::App& root) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = root.add_subcommand("generate", "sample text from a trained checkpoint");
  command->add_option("--load", options->load, "checkpoint folder (a save folder or one iter_* in it)")
      ->required();
  command->add_option("--prompt", options->prompt, "text to continue");
  command->add_option("--max-new-tokens", options->max_new_tokens, "tokens to generate");
  command->add_option("--temperature", options->temperature, "softmax temperature (0: greedy)");
  command->add_option("--top-k", options->top_k, "sample among the k likeliest tokens (0: all)");
  command->add_option("--seed", options->seed, "random seed for sampling");
  command->add_option("--device", options->device, "cpu or cuda");
  command->callback([options] { generate(*options); });
}

}  // namespace kiln::cli
