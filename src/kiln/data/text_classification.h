// Sequence-classification data as raw text, tokenized with GPT-2's BPE when a sample is read.
// A path is one file or a folder whose .csv and .jsonl files (sorted by name; other files are
// ignored) are read in order, locally or on S3 through a Storage:
//   .csv    a header row naming the columns, then one record per row, RFC 4180: fields split by
//           commas; a field in double quotes may hold commas, doubled quotes ("") and line breaks,
//           so a record may span lines. Line ends are \n or \r\n; a leading UTF-8 BOM is skipped.
//           Every row has as many fields as the header.
//             text,label
//             "Win a prize, now!",1
//   .jsonl  one JSON object per line: {"text": "Win a prize, now!", "label": 1}
// Blank lines are skipped in both. The text and label keys are options ("text", "label"); the
// label is an integer (a JSON integer, or a CSV field of digits) in [0, num_labels).
// Unlabelled data (labels_required false, for labelling texts: kiln classify): a row may have no
// label, that is no label field in .jsonl (or null) and, in .csv, no label column or an empty label
// field; its label is then kNoLabel. Within one file the rows all have a label or all have none:
// the first row decides, and a later one that differs is an error naming the file and row.
//
// Opening reads each file once, records every row's byte range and checks it without tokenizing:
// text and label present, label an integer in [0, num_labels), text non-empty and valid UTF-8
// (for .jsonl the whole line, since JSON itself must be UTF-8), JSON well formed. Each failure is
// a kiln::Error naming the file, the row (1-based record number) and the line the row starts on:
//   data/spam.csv row 12 (line 40): no 'label' field (2 fields, the header has 3)
// sample(i) reads row i again, tokenizes its text (the per-sample CPU work), keeps the first
// seq_length ids, pads the rest with kPadId and sets attention_mask to 1 on real tokens and 0 on
// padding. GPT-2 has no pad token; kPadId is <|endoftext|> (50256), the usual stand-in; the mask,
// not the id, is what marks padding. Only a prefix of a long text is tokenized, cut where its ids
// are a prefix of the whole text's (before a space followed by printable ASCII), so a 100 KB e-mail
// costs about what its first ids cost; a text with no such cut after its first ids (a base64
// attachment to the end, CJK text) is tokenized whole.
//
// The tokenizer is borrowed: it must outlive the dataset. Thread-safe for concurrent sample()
// (loader workers); the files are not expected to change while open.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data/classification_csv.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/storage/storage.h"

namespace kiln {

struct TextClassificationOptions {
  std::string text_key = "text";    // --text-key
  std::string label_key = "label";  // --label-key
  int64_t seq_length = 128;         // ids per sample, after truncation and padding
  int64_t num_labels = 2;
  bool labels_required = true;  // false: a file's rows may all be unlabelled (above)
};

class TextClassificationDataset {
 public:
  static constexpr int32_t kPadId = Gpt2Tokenizer::kEndOfText;
  static constexpr int32_t kNoLabel = -1;  // an unlabelled row's label (labels_required false)

  TextClassificationDataset(const std::string& path, const Gpt2Tokenizer& tokenizer,
                            TextClassificationOptions options = {},
                            const Storage& storage = Storage::defaults());

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  int64_t seq_length() const { return options_.seq_length; }
  int64_t num_labels() const { return options_.num_labels; }
  int64_t vocab_size() const { return tokenizer_.vocab_size(); }
  // Labelled rows per label, indexed by label (num_labels entries): the majority-class baseline.
  const std::vector<int64_t>& label_counts() const { return label_counts_; }
  // The row's label without reading the file (known from the index); kNoLabel if it has none.
  int32_t label(int64_t index) const;
  ClassificationSample sample(int64_t index) const;

 private:
  enum class Format : uint8_t { Csv, Jsonl };
  struct File {
    std::unique_ptr<RandomAccessFile> file;
    Format format;
    int32_t text_column = -1, label_column = -1, columns = 0;  // CSV only; label_column -1: none
    std::optional<bool> labelled;  // whether its rows have labels, set by its first row
  };
  struct Row {
    int32_t file;
    int32_t label;
    int64_t record;  // 1-based row number in the file, for errors
    int64_t line;    // 1-based line the row starts on, for errors
    int64_t offset;  // byte offset of the row
    int64_t length;  // bytes, without the line end
  };

  void index_csv(int32_t file_index, const std::string& bytes);
  void index_jsonl(int32_t file_index, const std::string& bytes);
  // Appends an indexed row of `file`, whose rows must all have a label or all have none (the
  // first decides); `where` names it in errors.
  void add_row(File& file, const Row& row, const std::string& where);
  // Checks one row and returns its text; `where` names it in errors.
  std::string row_text(const File& file, std::string_view row, const std::string& where,
                       int32_t* label) const;

  const Gpt2Tokenizer& tokenizer_;
  TextClassificationOptions options_;
  std::vector<File> files_;
  std::vector<Row> rows_;
  std::vector<int64_t> label_counts_;
};

}  // namespace kiln
