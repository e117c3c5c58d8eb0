#include "kiln/data/prepare_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/data/token_shard.h"

namespace kiln {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  KILN_CHECK(!inputs.empty(), "prepare-text: no input files given");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code error;
    if (fs::is_directory(input, error)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input))
        if (entry.is_regular_file() && entry.path().extension() == ".txt")
          found.push_back(entry.path().string());
      std::sort(found.begin(), found.end());
      KILN_CHECK(!found.empty(), "prepare-text: folder '{}' holds no .txt files", input);
      files.insert(files.end(), found.begin(), found.end());
    } else {
      KILN_CHECK(fs::is_regular_file(input, error), "prepare-text: input '{}' does not exist", input);
      files.push_back(input);
    }
  }
  return files;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  KILN_CHECK(stream.good(), "cannot open '{}'", path);
  std::ostringstream contents;
  contents << stream.rdbuf();
  KILN_CHECK(!stream.bad(), "cannot read '{}'", path);
  return contents.str();
}

void write_split(const std::string& dir, const std::string& split, const std::vector<uint16_t>& tokens,
                 int64_t shard_tokens, PrepareTextSummary& summary) {
  const size_t per_shard = static_cast<size_t>(shard_tokens);
  for (size_t begin = 0, index = 0; begin < tokens.size(); begin += per_shard, ++index) {
    const size_t end = std::min(tokens.size(), begin + per_shard);
    const std::string path = fmt::format("{}/{}_{:06d}.bin", dir, split, index);
    write_token_shard(path, std::span(tokens).subspan(begin, end - begin));
    summary.shards.push_back(path);
  }
}

// Where a single document's validation text starts: at `val_fraction` from its end, moved back to
// just after the nearest line break in the training part's second half, else to the start of a
// UTF-8 character. `text` is the document's bytes without its end-of-document id.
size_t position_split(const std::vector<uint16_t>& text, double val_fraction) {
  const size_t size = text.size();
  size_t cut = size - std::max<size_t>(1, static_cast<size_t>(val_fraction * static_cast<double>(size)));
  for (size_t i = cut; i > cut / 2; --i)
    if (text[i - 1] == '\n') return i;
  while (cut > 0 && (text[cut] & 0xc0) == 0x80) --cut;  // not inside a multi-byte character
  return cut;
}

}  // namespace

int64_t find_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    size_t length;
    uint32_t code;
    if (lead < 0x80) { ++i; continue; }
    if ((lead & 0xe0) == 0xc0) { length = 2; code = lead & 0x1f; }
    else if ((lead & 0xf0) == 0xe0) { length = 3; code = lead & 0x0f; }
    else if ((lead & 0xf8) == 0xf0) { length = 4; code = lead & 0x07; }
    else return static_cast<int64_t>(i);
    if (i + length > size) return static_cast<int64_t>(i);
    for (size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xc0) != 0x80) return static_cast<int64_t>(i);
      code = (code << 6) | (bytes[i + k] & 0x3f);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    static constexpr uint32_t kMinimum[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kMinimum[length] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff)
      return static_cast<int64_t>(i);
    i += length;
  }
  return -1;
}

PrepareTextSummary prepare_text(const PrepareTextOptions& options) {
  KILN_CHECK(options.val_fraction >= 0.0 && options.val_fraction < 1.0,
             "prepare-text: val fraction {} is outside [0, 1)", options.val_fraction);
  KILN_CHECK(options.shard_tokens > 0, "prepare-text: shard size {} must be positive", options.shard_tokens);
  KILN_CHECK(!options.output_dir.empty(), "prepare-text: no output folder given");
  const std::vector<std::string> files = expand_inputs(options.inputs);

  std::vector<std::vector<uint16_t>> documents;
  for (const std::string& path : files) {
    const std::string text = read_whole_file(path);
    const int64_t bad = find_invalid_utf8(text);
    KILN_CHECK(bad < 0, "prepare-text: '{}' is not valid UTF-8 at byte offset {}", path, bad);
    std::vector<uint16_t> tokens(text.size() + 1);
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    tokens.back() = static_cast<uint16_t>(kByteEndOfDocument);
    documents.push_back(std::move(tokens));
  }

  // One document: nothing whole can be held out, so its end is (above).
  bool split_by_position = false;
  if (documents.size() == 1 && options.val_fraction > 0.0 && documents[0].size() > 2) {
    std::vector<uint16_t>& whole = documents[0];
    const size_t cut = position_split({whole.begin(), whole.end() - 1}, options.val_fraction);
    if (cut > 0) {
      std::vector<uint16_t> tail(whole.begin() + static_cast<std::ptrdiff_t>(cut), whole.end());
      whole.resize(cut);
      whole.push_back(static_cast<uint16_t>(kByteEndOfDocument));
      documents.push_back(std::move(tail));
      split_by_position = true;
    }
  }

  // Hold out whole documents in a seeded random order until the fraction is reached.
  const int64_t total = std::accumulate(documents.begin(), documents.end(), int64_t{0},
                                        [](int64_t sum, const auto& doc) { return sum + static_cast<int64_t>(doc.size()); });
  std::vector<size_t> order(documents.size());
  std::iota(order.begin(), order.end(), size_t{0});
  Rng rng(options.seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  std::vector<bool> is_val(documents.size(), false);
  if (split_by_position) is_val[1] = true;
  int64_t held_out = 0;
  for (size_t index : split_by_position ? std::vector<size_t>{} : order) {
    if (options.val_fraction == 0.0 || documents.size() < 2) break;
    if (static_cast<double>(held_out) >= options.val_fraction * static_cast<double>(total)) break;
    is_val[index] = true;
    held_out += static_cast<int64_t>(documents[index].size());
  }

  PrepareTextSummary summary;
  summary.split_by_position = split_by_position;
  summary.documents = static_cast<int64_t>(files.size());
  std::vector<uint16_t> train, val;
  for (size_t i = 0; i < documents.size(); ++i) {
    auto& target = is_val[i] ? val : train;
    target.insert(target.end(), documents[i].begin(), documents[i].end());
    (is_val[i] ? summary.val_documents : summary.train_documents) += 1;
  }
  KILN_CHECK(!train.empty(), "prepare-text: every document went to validation; lower the val fraction");
  summary.train_tokens = static_cast<int64_t>(train.size());
  summary.val_tokens = static_cast<int64_t>(val.size());

  fs::create_directories(options.output_dir);
  write_split(options.output_dir, "train", train, options.shard_tokens, summary);
  write_split(options.output_dir, "val", val, options.shard_tokens, summary);
  const nlohmann::json meta = {{"tokenizer", "bytes"},
                               {"vocab_size", kByteVocabSize},
                               {"end_of_document", kByteEndOfDocument},
                               {"documents", summary.documents},
                               {"train_tokens", summary.train_tokens},
                               {"val_tokens", summary.val_tokens}};
  write_file_atomically(options.output_dir + "/meta.json", meta.dump(2) + "\n");
  return summary;
}

}  // namespace kiln
