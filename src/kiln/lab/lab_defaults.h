// What `kiln lab` measures when the user does not say: the base configuration when no model is
// named, and the data it writes when none is given.
//
// The default base is the seed lab's classifier (nn/encoder_config.h: 18 layers, hidden 1280, FFN
// 4 x 1280, 20 heads, sequence 512, 2 intermediate layers, 2 labels, micro-batch 5) scaled to the
// device: on CUDA that shape itself; on the CPU 2 layers of 128 (2 heads: the lab's 64 per head),
// sequence 128, micro-batch 8, so the whole default lab takes under a minute on two idle cores.
// Its vocabulary is left to the data (GPT-2's 50257 for the synthetic text below; the lab's 30000
// was its own tokenizer's).
//
// The synthetic text is what lab 1 needs to measure the loader's workers: raw text that the
// workers tokenize per sample (data/text_classification.h), as a real text-classification run
// does. Each row of train.jsonl is words of a fixed lexicon of common English words, some of them
// cue words that each belong to one label; a row's label is the label most of its cue words belong
// to (the lowest on a tie, 0 without any), so a model has something to learn. A row has at most
// seq_length / 2 words, each one GPT-2 token after a space (the first word at most three), so a
// sample of seq_length >= 4 holds its whole text and every cue its label came from.
//
// GPT's default data stays random token ids in token shards (data/token_shard.h).
// Pure functions, except the writers, whose write failures are kiln::Errors naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/train/config.h"

namespace kiln {

// The seed lab's classifier on `cuda` or the CPU, as above (device set to match).
Config lab_classifier_base(bool cuda);

struct SyntheticTextOptions {
  int64_t rows = 4096;
  int64_t seq_length = 128;  // a row has seq_length / 4 to seq_length / 2 words (at least one)
  int64_t num_labels = 2;
  std::string text_key = "text", label_key = "label";  // the JSON fields (--text-key, --label-key)
  uint64_t seed = 1234;
};

// Writes `path` (train.jsonl): one {"<text_key>": "...", "<label_key>": label} object a line.
void write_synthetic_text(const std::string& path, const SyntheticTextOptions& options);

// The label of `text` (space-separated words) among `num_labels`, as above; exposed for tests.
int64_t synthetic_text_label(std::string_view text, int64_t num_labels);

// Random token ids in [0, vocab_size) in `dir`: train_000000.bin (2 M tokens), val_000000.bin
// (64 K) and meta.json, what `kiln lab` gives GPT when no data is named.
void write_random_token_data(const std::string& dir, int64_t vocab_size, uint64_t seed);

}  // namespace kiln
