// Sequence-classification data as CSV files (the shape of the lab this project grew from):
//   input_ids,attention_mask,label
//   "101,2054,2003,0","1,1,1,0",1
// ids and mask are comma-separated integers of one length (quoted, as CSV requires), label an
// integer. A folder holds many such files (part-00000.csv, ...) and metadata.json listing each
// file's rows, the sequence length, vocabulary and label count.
//
// write_synthetic_classification() makes such a folder from a seed (`kiln data synth`): random
// ids, a random amount of trailing padding (id 0, mask 0), and label = input_ids[1] % num_labels
// so a model has something to learn. ClassificationDataset opens a folder (local or S3, through a
// Storage), checks each file's row count against the metadata, and indexes every row's byte offset
// in one pass per file; a sample is then one read of one line. Malformed rows (missing field, non-integer, lengths that
// disagree, id beyond the vocabulary, label beyond the label count) are errors naming file and row.
// Thread-safe for concurrent sample().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/storage/storage.h"

namespace kiln {

struct ClassificationSynthOptions {
  std::string output_dir;
  int64_t files = 10, min_rows = 100, max_rows = 1000;
  int64_t seq_length = 128, vocab_size = 30522, num_labels = 2;
  uint64_t seed = 1234;
};

struct ClassificationSample {
  std::vector<int32_t> input_ids, attention_mask;
  int32_t label = 0;
};

// Returns the total number of rows written.
int64_t write_synthetic_classification(const ClassificationSynthOptions& options);

class ClassificationDataset {
 public:
  explicit ClassificationDataset(const std::string& dir, const Storage& storage = Storage::defaults());

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  int64_t seq_length() const { return seq_length_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_labels() const { return num_labels_; }
  ClassificationSample sample(int64_t index) const;

 private:
  struct Row {
    int32_t file;
    int32_t line;     // 1-based line number in the file, for errors
    int64_t offset;   // byte offset of the line
    int64_t length;   // bytes, without the newline
  };
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<Row> rows_;
  int64_t seq_length_ = 0, vocab_size_ = 0, num_labels_ = 0;
};

}  // namespace kiln
