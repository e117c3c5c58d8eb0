#include "kiln/data/text_classification.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/data/prepare_text.h"

namespace kiln {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Splits one CSV record (its line end removed) into unescaped fields, RFC 4180: a field in double
// quotes may hold commas, line breaks and doubled quotes; an unquoted field holds no quote.
std::vector<std::string> split_csv_record(std::string_view record, const std::string& where) {
  std::vector<std::string> fields;
  size_t i = 0;
  const size_t n = record.size();
  while (true) {
    std::string field;
    if (i < n && record[i] == '"') {
      ++i;
      while (true) {
        const size_t quote = record.find('"', i);
        KILN_CHECK(quote != std::string_view::npos, "{}: field {} opens a quote that is not closed",
                   where, fields.size() + 1);
        field.append(record.substr(i, quote - i));
        i = quote + 1;
        if (i < n && record[i] == '"') {  // "" stands for one quote
          field += '"';
          ++i;
        } else {
          break;
        }
      }
      KILN_CHECK(i == n || record[i] == ',', "{}: field {} has text after its closing quote", where,
                 fields.size() + 1);
    } else {
      const size_t end = std::min(record.find(',', i), n);
      const std::string_view plain = record.substr(i, end - i);
      KILN_CHECK(plain.find('"') == std::string_view::npos,
                 "{}: field {} has a quote but does not start with one (quote the whole field, "
                 "doubling its quotes)",
                 where, fields.size() + 1);
      field = plain;
      i = end;
    }
    fields.push_back(std::move(field));
    if (i == n) return fields;
    ++i;  // the comma
  }
}

int32_t checked_label(int64_t value, std::string_view shown, int64_t num_labels,
                      const std::string& where) {
  KILN_CHECK(value >= 0 && value < num_labels, "{}: label {} is outside [0, {})", where, shown,
             num_labels);
  return static_cast<int32_t>(value);
}

// A CSV row's label field: an integer in [0, num_labels) or, with labels optional, empty (no
// label).
int32_t csv_label(const std::string& shown, const TextClassificationOptions& options,
                  const std::string& where) {
  if (shown.empty() && !options.labels_required) return TextClassificationDataset::kNoLabel;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(shown.data(), shown.data() + shown.size(), value);
  KILN_CHECK(error == std::errc() && end == shown.data() + shown.size() && !shown.empty(),
             "{}: label '{}' is not an integer in [0, {})", where, shown, options.num_labels);
  return checked_label(value, shown, options.num_labels, where);
}

// A JSON row's label: an integer in [0, num_labels) or, with labels optional, absent or null (no
// label).
int32_t json_label(const nlohmann::json& row, const TextClassificationOptions& options,
                   const std::string& where) {
  const auto field = row.find(options.label_key);
  if (!options.labels_required && (field == row.end() || field->is_null()))
    return TextClassificationDataset::kNoLabel;
  KILN_CHECK(field != row.end(), "{}: no '{}' field", where, options.label_key);
  const std::string shown = field->dump();
  KILN_CHECK(field->is_number_integer(), "{}: label {} is not an integer in [0, {})", where, shown,
             options.num_labels);
  const int64_t value =
      field->is_number_unsigned()
          ? static_cast<int64_t>(std::min<uint64_t>(field->get<uint64_t>(), INT64_MAX))
          : field->get<int64_t>();
  return checked_label(value, shown, options.num_labels, where);
}

void check_text(const std::string& text, const std::string& key, const std::string& where) {
  KILN_CHECK(!text.empty(), "{}: empty '{}' field", where, key);
  const int64_t bad = find_invalid_utf8(text);
  KILN_CHECK(bad < 0, "{}: '{}' is not valid UTF-8 at byte offset {}", where, key, bad);
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The ids of `text` from the start, at least `wanted` of them where the text has that many. In
// GPT-2's pattern a space followed by a printable ASCII character can only start a piece, so a
// prefix cut just before such a space has the same pieces as the whole text up to the cut, and
// its ids are a prefix of the whole text's ids (tested against encode() on every e-mail).
// Tokenizing a growing prefix keeps long documents (e-mails of 100 KB) from costing their length.
std::vector<int32_t> encode_prefix(const Gpt2Tokenizer& tokenizer, std::string_view text,
                                   size_t wanted) {
  size_t budget = std::max<size_t>(wanted * 8, 256);
  while (budget < text.size()) {
    size_t cut = budget;
    while (cut + 1 < text.size() &&
           !(text[cut] == ' ' && text[cut + 1] > ' ' && text[cut + 1] < 0x7f))
      ++cut;
    if (cut + 1 >= text.size()) break;
    std::vector<int32_t> ids = tokenizer.encode(text.substr(0, cut));
    if (ids.size() >= wanted) return ids;
    budget = cut * 2;
  }
  return tokenizer.encode(text);
}

}  // namespace

TextClassificationDataset::TextClassificationDataset(const std::string& path,
                                                     const Gpt2Tokenizer& tokenizer,
                                                     TextClassificationOptions options,
                                                     const Storage& storage)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  KILN_CHECK(options_.seq_length >= 1 && options_.seq_length <= std::numeric_limits<int32_t>::max(),
             "{}: sequence length {} must be positive", path, options_.seq_length);
  KILN_CHECK(options_.num_labels >= 2 && options_.num_labels <= std::numeric_limits<int32_t>::max(),
             "{}: need at least 2 labels, got {}", path, options_.num_labels);
  KILN_CHECK(!options_.text_key.empty() && !options_.label_key.empty() &&
                 options_.text_key != options_.label_key,
             "{}: text key '{}' and label key '{}' must be two different non-empty names", path,
             options_.text_key, options_.label_key);
  label_counts_.assign(static_cast<size_t>(options_.num_labels), 0);

  std::vector<std::string> paths;
  if (ends_with(path, ".csv") || ends_with(path, ".jsonl")) {
    paths.push_back(path);
  } else {
    std::vector<std::string> names;
    try {
      names = storage.list(path);
    } catch (const Error& error) {
      fail(
          "text classification data '{}' is neither a .csv or .jsonl file nor a folder of them "
          "({})",
          path, error.what());
    }
    for (const std::string& name : names)
      if (ends_with(name, ".csv") || ends_with(name, ".jsonl")) paths.push_back(path + "/" + name);
    KILN_CHECK(!paths.empty(), "{}: no .csv or .jsonl files in this folder", path);
  }
  for (const std::string& file_path : paths) {
    File file;
    file.file = storage.open(file_path);
    file.format = ends_with(file_path, ".csv") ? Format::Csv : Format::Jsonl;
    files_.push_back(std::move(file));
    const RandomAccessFile& bytes_of = *files_.back().file;
    std::string bytes(bytes_of.size(), '\0');
    bytes_of.read(0, {reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()});
    const auto index = static_cast<int32_t>(files_.size() - 1);
    if (files_.back().format == Format::Csv)
      index_csv(index, bytes);
    else
      index_jsonl(index, bytes);
  }
  KILN_CHECK(!rows_.empty(), "{}: no rows", path);
}

void TextClassificationDataset::index_csv(int32_t file_index, const std::string& bytes) {
  File& file = files_[static_cast<size_t>(file_index)];
  const std::string& name = file.file->name();
  size_t pos = bytes.compare(0, kBom.size(), kBom) == 0 ? kBom.size() : 0;
  int64_t line = 1, record = 0;
  bool header_seen = false;
  while (pos < bytes.size()) {
    // A record ends at the first line break outside quotes; a doubled quote toggles twice.
    size_t end = pos;
    bool quoted = false;
    int64_t breaks_inside = 0;
    for (; end < bytes.size(); ++end) {
      const char c = bytes[end];
      if (c == '"') {
        quoted = !quoted;
      } else if (c == '\n') {
        if (!quoted) break;
        ++breaks_inside;
      }
    }
    const int64_t start_line = line;
    line += breaks_inside + 1;
    KILN_CHECK(!quoted,
               "{} row {} (line {}): a quoted field is not closed before the end of the file", name,
               record + 1, start_line);
    size_t length = end - pos;
    if (length > 0 && bytes[pos + length - 1] == '\r') --length;
    const std::string_view text(bytes.data() + pos, length);
    const size_t offset = pos;
    pos = end + 1;
    if (is_blank(text)) continue;
    if (!header_seen) {
      header_seen = true;
      const std::vector<std::string> columns =
          split_csv_record(text, fmt::format("{}:{}: header", name, start_line));
      file.columns = static_cast<int32_t>(columns.size());
      for (size_t c = 0; c < columns.size(); ++c) {
        if (columns[c] == options_.text_key) file.text_column = static_cast<int32_t>(c);
        if (columns[c] == options_.label_key) file.label_column = static_cast<int32_t>(c);
      }
      std::string names;
      for (const std::string& column : columns) names += (names.empty() ? "" : ", ") + column;
      KILN_CHECK(file.text_column >= 0, "{}:{}: the header ({}) has no '{}' column (the text key)",
                 name, start_line, names, options_.text_key);
      KILN_CHECK(file.label_column >= 0 || !options_.labels_required,
                 "{}:{}: the header ({}) has no '{}' column (the label key)", name, start_line,
                 names, options_.label_key);
      continue;
    }
    ++record;
    Row row{file_index,
            0,
            record,
            start_line,
            static_cast<int64_t>(offset),
            static_cast<int64_t>(length)};
    const std::string where = fmt::format("{} row {} (line {})", name, record, start_line);
    row_text(file, text, where, &row.label);
    add_row(file, row, where);
  }
  KILN_CHECK(header_seen, "{}: empty file (a CSV file starts with a header row naming its columns)",
             name);
}

void TextClassificationDataset::index_jsonl(int32_t file_index, const std::string& bytes) {
  File& file = files_[static_cast<size_t>(file_index)];
  const std::string& name = file.file->name();
  size_t pos = 0;
  int64_t line = 0, record = 0;
  while (pos < bytes.size()) {
    const size_t end = std::min(bytes.find('\n', pos), bytes.size());
    size_t length = end - pos;
    if (length > 0 && bytes[pos + length - 1] == '\r') --length;
    const std::string_view text(bytes.data() + pos, length);
    const size_t offset = pos;
    pos = end + 1;
    ++line;
    if (is_blank(text)) continue;
    ++record;
    Row row{
        file_index, 0, record, line, static_cast<int64_t>(offset), static_cast<int64_t>(length)};
    const std::string where = fmt::format("{} row {} (line {})", name, record, line);
    row_text(file, text, where, &row.label);
    add_row(file, row, where);
  }
}

void TextClassificationDataset::add_row(File& file, const Row& row, const std::string& where) {
  const bool labelled = row.label != kNoLabel;
  if (!file.labelled) file.labelled = labelled;
  KILN_CHECK(
      *file.labelled == labelled,
      "{}: {}, but the file's first row {}: a file's rows must all have a label or all have none",
      where, labelled ? "has a label" : "has no label", labelled ? "has none" : "has one");
  if (labelled) ++label_counts_[static_cast<size_t>(row.label)];
  rows_.push_back(row);
}

std::string TextClassificationDataset::row_text(const File& file, std::string_view row,
                                                const std::string& where, int32_t* label) const {
  const std::string& text_key = options_.text_key;
  const std::string& label_key = options_.label_key;
  if (file.format == Format::Csv) {
    std::vector<std::string> fields = split_csv_record(row, where);
    const auto count = static_cast<int32_t>(fields.size());
    KILN_CHECK(count > file.text_column, "{}: no '{}' field ({} fields, the header has {})", where,
               text_key, count, file.columns);
    KILN_CHECK(count > file.label_column, "{}: no '{}' field ({} fields, the header has {})", where,
               label_key, count, file.columns);
    KILN_CHECK(count == file.columns, "{}: {} fields, the header has {}", where, count,
               file.columns);
    *label = file.label_column < 0
                 ? kNoLabel
                 : csv_label(fields[static_cast<size_t>(file.label_column)], options_, where);
    std::string& text = fields[static_cast<size_t>(file.text_column)];
    check_text(text, text_key, where);
    return std::move(text);
  }
  const int64_t bad = find_invalid_utf8(row);
  KILN_CHECK(bad < 0, "{}: not valid UTF-8 at byte offset {} of the line", where, bad);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(row);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: malformed JSON: {}", where, error.what());
  }
  KILN_CHECK(json.is_object(), "{}: not a JSON object", where);
  const auto text_field = json.find(text_key);
  KILN_CHECK(text_field != json.end(), "{}: no '{}' field", where, text_key);
  KILN_CHECK(text_field->is_string(), "{}: '{}' is not a string", where, text_key);
  *label = json_label(json, options_, where);
  std::string text = text_field->get<std::string>();
  check_text(text, text_key, where);
  return text;
}

int32_t TextClassificationDataset::label(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "text classification row {} outside [0, {})", index,
             size());
  return rows_[static_cast<size_t>(index)].label;
}

ClassificationSample TextClassificationDataset::sample(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "text classification sample {} outside [0, {})", index,
             size());
  const Row& row = rows_[static_cast<size_t>(index)];
  const File& file = files_[static_cast<size_t>(row.file)];
  std::string bytes(static_cast<size_t>(row.length), '\0');
  file.file->read(static_cast<uint64_t>(row.offset),
                  {reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()});
  int32_t label = 0;
  const std::string text =
      row_text(file, bytes,
               fmt::format("{} row {} (line {})", file.file->name(), row.record, row.line), &label);
  KILN_CHECK(label == row.label,
             "{} row {} (line {}): label changed from {} to {} since the file was opened",
             file.file->name(), row.record, row.line, row.label, label);

  const auto length = static_cast<size_t>(options_.seq_length);
  ClassificationSample sample;
  sample.input_ids = encode_prefix(tokenizer_, text, length);
  const size_t used = std::min(sample.input_ids.size(), length);
  sample.input_ids.resize(length, kPadId);
  sample.attention_mask.assign(length, 0);
  std::fill_n(sample.attention_mask.begin(), used, 1);
  sample.label = label;
  return sample;
}

}  // namespace kiln
