#include "kiln/lab/lab_defaults.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/data/token_shard.h"

namespace kiln {
namespace {

// Words that carry no label. Common English words, as the cue words below: one GPT-2 token each
// after a space (at most three without one).
constexpr std::array<std::string_view, 96> kNeutralWords = {
    "the",   "a",      "of",     "and",    "to",     "in",     "was",   "it",      "for",
    "on",    "with",   "as",     "at",     "by",     "from",   "this",  "that",    "we",
    "they",  "he",     "she",    "you",    "our",    "their",  "his",   "her",     "its",
    "or",    "but",    "not",    "all",    "some",   "more",   "each",  "one",     "two",
    "three", "day",    "week",   "year",   "time",   "people", "city",  "house",   "room",
    "road",  "river",  "water",  "light",  "book",   "letter", "table", "window",  "door",
    "train", "car",    "ship",   "market", "school", "garden", "field", "morning", "evening",
    "night", "winter", "summer", "after",  "before", "under",  "over",  "about",   "near",
    "new",   "old",    "long",   "small",  "large",  "open",   "walk",  "read",    "write",
    "bring", "build",  "cook",   "speak",  "watch",  "meet",   "leave", "travel",  "work",
    "play",  "rain",   "stone",  "paper",  "music",  "story"};

// Words that carry a label: cue word i belongs to label i % num_labels (with two labels, the
// even ones read as negative and the odd ones as positive).
constexpr std::array<std::string_view, 48> kCueWords = {
    "terrible", "wonderful", "awful", "excellent", "broken", "perfect", "angry",  "happy",
    "sad",      "glad",      "poor",  "great",     "dirty",  "clean",   "boring", "exciting",
    "slow",     "fast",      "cold",  "warm",      "dark",   "bright",  "weak",   "strong",
    "wrong",    "right",     "ugly",  "beautiful", "bad",    "good",    "hate",   "love",
    "fear",     "hope",      "fail",  "win",       "worst",  "best",    "noisy",  "quiet",
    "rude",     "kind",      "sick",  "healthy",   "lost",   "found",   "empty",  "full"};

// The label `word` is a cue for, or -1.
int64_t cue_label(std::string_view word, int64_t num_labels) {
  const auto found = std::find(kCueWords.begin(), kCueWords.end(), word);
  return found == kCueWords.end() ? -1 : (found - kCueWords.begin()) % num_labels;
}

}  // namespace

Config lab_classifier_base(bool cuda) {
  Config config;
  config.model = "encoder-classifier";
  config.device = cuda ? "cuda" : "cpu";
  config.num_intermediate_layers = 2;
  config.num_labels = 2;
  config.vocab_size = 0;  // from the data
  if (cuda) {
    config.num_layers = 18;
    config.hidden_size = 1280;
    config.num_attention_heads = 20;
    config.seq_length = 512;
    config.micro_batch_size = 5;
  } else {
    config.num_layers = 2;
    config.hidden_size = 128;
    config.num_attention_heads = 2;
    config.seq_length = 128;
    config.micro_batch_size = 8;
  }
  return config;
}

int64_t synthetic_text_label(std::string_view text, int64_t num_labels) {
  KILN_CHECK(num_labels >= 1, "synthetic text needs at least one label, got {}", num_labels);
  // Labels beyond the lexicon have no cue words, so never the most.
  std::vector<int64_t> cues(std::min(static_cast<size_t>(num_labels), kCueWords.size()), 0);
  while (!text.empty()) {
    const size_t end = std::min(text.find(' '), text.size());
    const int64_t label = cue_label(text.substr(0, end), num_labels);
    if (label >= 0) ++cues[static_cast<size_t>(label)];
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return std::max_element(cues.begin(), cues.end()) - cues.begin();  // the first of equal counts
}

void write_synthetic_text(const std::string& path, const SyntheticTextOptions& options) {
  KILN_CHECK(options.rows > 0 && options.seq_length > 0 && options.num_labels >= 1,
             "synthetic text needs rows, seq_length and num_labels positive (got {}, {}, {})",
             options.rows, options.seq_length, options.num_labels);
  const auto labels = static_cast<uint64_t>(options.num_labels);
  // Each label's cue words (none for a label beyond the lexicon).
  std::vector<std::vector<std::string_view>> cues(labels);
  for (size_t i = 0; i < kCueWords.size(); ++i) cues[i % labels].push_back(kCueWords[i]);
  const auto fewest = static_cast<uint64_t>(std::max<int64_t>(1, options.seq_length / 4));
  const uint64_t most = std::max(fewest, static_cast<uint64_t>(options.seq_length / 2));
  Rng rng(options.seed);
  std::string lines;
  for (int64_t row = 0; row < options.rows; ++row) {
    const uint64_t leaning = rng.below(labels);
    const uint64_t words = fewest + rng.below(most - fewest + 1);
    std::string text;
    for (uint64_t w = 0; w < words; ++w) {
      std::string_view word = kNeutralWords[rng.below(kNeutralWords.size())];
      if (rng.below(4) == 0) {  // a quarter are cues, three in four of them the leaning label's
        const std::vector<std::string_view>& candidates =
            cues[rng.below(4) != 0 ? leaning : rng.below(labels)];
        if (!candidates.empty()) word = candidates[rng.below(candidates.size())];
      }
      if (!text.empty()) text += ' ';
      text += word;
    }
    const nlohmann::json line = {
        {options.text_key, text},
        {options.label_key, synthetic_text_label(text, options.num_labels)}};
    lines += line.dump() + "\n";
  }
  write_file_atomically(path, lines);
}

void write_random_token_data(const std::string& dir, int64_t vocab_size, uint64_t seed) {
  KILN_CHECK(vocab_size > 0 && vocab_size <= 65536,
             "kiln lab: random-token data needs --vocab-size in [1, 65536], got {}", vocab_size);
  Rng rng(seed);
  const auto tokens = [&](int64_t count) {
    std::vector<uint16_t> values(static_cast<size_t>(count));
    for (uint16_t& value : values)
      value = static_cast<uint16_t>(rng.below(static_cast<uint64_t>(vocab_size)));
    return values;
  };
  write_token_shard(dir + "/train_000000.bin", tokens(int64_t{1} << 21));
  write_token_shard(dir + "/val_000000.bin", tokens(int64_t{1} << 16));
  write_file_atomically(dir + "/meta.json", fmt::format("{{\"vocab_size\": {}}}\n", vocab_size));
}

}  // namespace kiln
