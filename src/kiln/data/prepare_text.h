// `kiln data prepare-text`: UTF-8 text files -> byte-level token shards.
//
// Tokenisation is the identity on bytes (ids 0..255) with one end-of-document id, 256, appended
// after each file's text, so the vocabulary is 257. Each input file is one document; whole
// documents go to validation, drawn reproducibly from `seed` until at least `val_fraction` of
// the tokens are held out (at least one document when there are two or more). A single document
// (nanoGPT's one input.txt) is split by position instead: its last `val_fraction` of bytes, cut
// at the line break nearest before that point (else at a character boundary), is the validation
// text, each part ending with the end-of-document id; the summary says so. Shards hold at
// most `shard_tokens` tokens: train_000000.bin, ..., val_000000.bin, plus meta.json recording the
// vocabulary. Inputs that are not valid UTF-8 are rejected with the file and byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

constexpr int32_t kByteVocabSize = 257;
constexpr int32_t kByteEndOfDocument = 256;

struct PrepareTextOptions {
  std::vector<std::string> inputs;  // files, or folders whose *.txt files are taken (sorted)
  std::string output_dir;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  uint64_t seed = 1234;
};

struct PrepareTextSummary {
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  bool split_by_position = false;  // one document: its end is the validation text
  std::vector<std::string> shards;
};

PrepareTextSummary prepare_text(const PrepareTextOptions& options);

// Byte offset of the first invalid UTF-8 sequence in `text`, or -1 when it is valid.
int64_t find_invalid_utf8(std::string_view text);

}  // namespace kiln
