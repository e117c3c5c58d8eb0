#include "kiln/data/classification_csv.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/json_numbers.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace fs = std::filesystem;
namespace {

constexpr const char* kHeader = "input_ids,attention_mask,label";

std::string join(const std::vector<int32_t>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) text += ',';
    text += std::to_string(values[i]);
  }
  return text;
}

// Splits one CSV line into fields, honouring double quotes (no embedded quotes in this format).
std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i <= line.size()) {
    if (i < line.size() && line[i] == '"') {
      const size_t close = line.find('"', i + 1);
      if (close == std::string_view::npos) return {};  // unterminated quote: reported as malformed
      fields.push_back(line.substr(i + 1, close - i - 1));
      i = close + 1;
      if (i < line.size() && line[i] != ',') return {};
      ++i;
    } else {
      const size_t comma = std::min(line.find(',', i), line.size());
      fields.push_back(line.substr(i, comma - i));
      i = comma + 1;
    }
  }
  return fields;
}

std::vector<int32_t> parse_integers(std::string_view text, const std::string& where, const char* field) {
  std::vector<int32_t> values;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t comma = std::min(text.find(',', i), text.size());
    const std::string_view item = text.substr(i, comma - i);
    int32_t value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    KILN_CHECK(error == std::errc() && end == item.data() + item.size() && !item.empty(),
               "{}: field '{}' has '{}', not an integer", where, field, std::string(item));
    values.push_back(value);
    i = comma + 1;
  }
  return values;
}

struct ClassificationMetadata {
  int64_t seq_length = 0, vocab_size = 0, num_labels = 0;
  std::vector<std::pair<std::string, int64_t>> files;  // name inside the folder, declared rows
};

// metadata.json, every value checked: positive sizes, plain file names, non-negative row counts.
ClassificationMetadata read_metadata(const std::string& meta_path, const Storage& storage) {
  ClassificationMetadata meta;
  try {
    const nlohmann::json json = nlohmann::json::parse(storage.read_all(meta_path));
    const auto positive = [&](const char* key) {
      return json_int64_at(json, key, 1, std::numeric_limits<int32_t>::max(), meta_path);
    };
    meta.seq_length = positive("seq_length");
    meta.vocab_size = positive("vocab_size");
    meta.num_labels = positive("num_labels");
    for (const nlohmann::json& entry : json.at("files").get<std::vector<nlohmann::json>>()) {
      const std::string name = entry.at("name").get<std::string>();
      KILN_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                 "{}: file name '{}' is not a plain name in the folder", meta_path, name);
      const int64_t rows =
          json_int64_at(entry, "rows", 0, std::numeric_limits<int32_t>::max(), meta_path + " (" + name + ")");
      meta.files.emplace_back(name, rows);
    }
  } catch (const nlohmann::json::exception& error) {
    fail("{}: {}", meta_path, error.what());
  }
  return meta;
}

}  // namespace

int64_t write_synthetic_classification(const ClassificationSynthOptions& o) {
  KILN_CHECK(o.files > 0 && o.min_rows > 0 && o.max_rows >= o.min_rows,
             "synth: need files > 0 and 0 < min rows <= max rows (got {}, {}, {})", o.files, o.min_rows, o.max_rows);
  KILN_CHECK(o.seq_length >= 2 && o.vocab_size >= 2 && o.num_labels >= 2,
             "synth: need seq length >= 2, vocabulary >= 2, labels >= 2 (got {}, {}, {})", o.seq_length, o.vocab_size,
             o.num_labels);
  fs::create_directories(o.output_dir);
  Rng rng(o.seed);
  nlohmann::json files = nlohmann::json::array();
  int64_t total = 0;
  for (int64_t f = 0; f < o.files; ++f) {
    const std::string name = fmt::format("part-{:05d}.csv", f);
    const int64_t rows = o.min_rows + static_cast<int64_t>(rng.below(static_cast<uint64_t>(o.max_rows - o.min_rows + 1)));
    std::string text(kHeader);
    text += '\n';
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t used = 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(o.seq_length - 1)));
      std::vector<int32_t> ids(static_cast<size_t>(o.seq_length), 0), mask(static_cast<size_t>(o.seq_length), 0);
      for (int64_t t = 0; t < used; ++t) {
        ids[static_cast<size_t>(t)] = 1 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab_size - 1)));
        mask[static_cast<size_t>(t)] = 1;
      }
      const int32_t label = ids[1] % static_cast<int32_t>(o.num_labels);
      text.append("\"").append(join(ids)).append("\",\"").append(join(mask)).append("\",");
      text.append(std::to_string(label)).append("\n");
    }
    write_file_atomically(o.output_dir + "/" + name, text);
    files.push_back({{"name", name}, {"rows", rows}});
    total += rows;
  }
  const nlohmann::json meta = {{"files", files}, {"rows", total}, {"seq_length", o.seq_length},
                               {"vocab_size", o.vocab_size}, {"num_labels", o.num_labels}};
  write_file_atomically(o.output_dir + "/metadata.json", meta.dump(2) + "\n");
  return total;
}

ClassificationDataset::ClassificationDataset(const std::string& dir, const Storage& storage) {
  const std::string meta_path = dir + "/metadata.json";
  KILN_CHECK(storage.exists(meta_path), "cannot open '{}' (a classification folder needs metadata.json)", meta_path);
  const ClassificationMetadata meta = read_metadata(meta_path, storage);
  seq_length_ = meta.seq_length;
  vocab_size_ = meta.vocab_size;
  num_labels_ = meta.num_labels;
  for (const auto& [name, declared] : meta.files) {
    const std::string path = dir + "/" + name;
    try {
      files_.push_back(storage.open(path));
    } catch (const Error& error) {
      fail("{}: lists '{}', which cannot be read: {}", meta_path, name, error.what());
    }
    const RandomAccessFile& file = *files_.back();
    const auto file_index = static_cast<int32_t>(files_.size() - 1);
    // One pass: the offset and length of every line after the header.
    std::string text(file.size(), '\0');
    file.read(0, {reinterpret_cast<uint8_t*>(text.data()), text.size()});
    int64_t offset = 0, in_file = 0;
    int32_t line_number = 0;
    while (offset < static_cast<int64_t>(text.size())) {
      const size_t end = std::min(text.find('\n', static_cast<size_t>(offset)), text.size());
      const std::string_view line(text.data() + offset, end - static_cast<size_t>(offset));
      ++line_number;
      if (line_number == 1) {
        KILN_CHECK(line == kHeader, "{}:1: header is '{}', expected '{}'", path, std::string(line), kHeader);
      } else if (!line.empty()) {
        rows_.push_back({file_index, line_number, offset, static_cast<int64_t>(line.size())});
        ++in_file;
      }
      offset = static_cast<int64_t>(end) + 1;
    }
    KILN_CHECK(in_file == declared, "{}: {} rows, but metadata.json says {} (truncated or replaced file?)", path,
               in_file, declared);
  }
  KILN_CHECK(!rows_.empty(), "{}: no rows", dir);
}

ClassificationSample ClassificationDataset::sample(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "classification sample {} outside [0, {})", index, size());
  const Row& row = rows_[static_cast<size_t>(index)];
  const RandomAccessFile& file = *files_[static_cast<size_t>(row.file)];
  const std::string& path = file.name();
  std::string line(static_cast<size_t>(row.length), '\0');
  file.read(static_cast<uint64_t>(row.offset), {reinterpret_cast<uint8_t*>(line.data()), line.size()});
  const std::string where = fmt::format("{}:{}", path, row.line);
  const std::vector<std::string_view> fields = split_fields(line);
  KILN_CHECK(fields.size() == 3, "{}: expected 3 fields (input_ids, attention_mask, label), found {}", where,
             fields.size());
  ClassificationSample sample;
  sample.input_ids = parse_integers(fields[0], where, "input_ids");
  sample.attention_mask = parse_integers(fields[1], where, "attention_mask");
  const std::vector<int32_t> label = parse_integers(fields[2], where, "label");
  KILN_CHECK(static_cast<int64_t>(sample.input_ids.size()) == seq_length_ &&
                 sample.attention_mask.size() == sample.input_ids.size(),
             "{}: {} input_ids and {} mask values, expected {} each", where, sample.input_ids.size(),
             sample.attention_mask.size(), seq_length_);
  for (size_t t = 0; t < sample.input_ids.size(); ++t) {
    KILN_CHECK(sample.input_ids[t] >= 0 && sample.input_ids[t] < vocab_size_,
               "{}: input_ids[{}] = {} is outside the vocabulary [0, {})", where, t, sample.input_ids[t], vocab_size_);
    KILN_CHECK(sample.attention_mask[t] == 0 || sample.attention_mask[t] == 1, "{}: attention_mask[{}] = {} is not 0 or 1",
               where, t, sample.attention_mask[t]);
  }
  KILN_CHECK(label.size() == 1 && label[0] >= 0 && label[0] < num_labels_, "{}: label {} is outside [0, {})", where,
             fields[2], num_labels_);
  sample.label = label[0];
  return sample;
}

}  // namespace kiln
