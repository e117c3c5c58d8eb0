// Megatron-LM's indexed dataset ("MMIDIDX"): PREFIX.bin holds token sequences back to back,
// PREFIX.idx describes them (all little-endian):
//   "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 (8 uint16, 4 int32)
//   | sequence count u64 | document count u64 (documents + 1)
//   | sequence lengths int32[sequences] | sequence byte offsets int64[sequences]
//   | document boundaries int64[documents + 1]: 0, then the sequence index that ends each document
//
// IndexedDatasetWriter appends documents and writes both files atomically (.bin first).
// IndexedDataset reads .idx whole and .bin by ranges, through a Storage (local map or pread, or
// S3), and validates on open: magic, version, dtype, sizes against the file lengths, every
// sequence inside .bin, boundaries increasing and ending at the sequence count. With
// vocab_size > 0 every token must be below the vocabulary: checked on open when .bin is
// memory-mapped, otherwise as tokens are read (a remote .bin is never downloaded whole). Errors
// name the file and the byte offset or index. Thread-safe for concurrent reads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/storage/storage.h"

namespace kiln {

enum class IndexedDType : uint8_t { UInt16 = 8, Int32 = 4 };

class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, IndexedDType dtype);
  // One document made of one sequence (as Megatron's preprocess_data writes without sentence splits).
  void add_document(std::span<const int32_t> tokens);
  void finish();  // writes PREFIX.bin and PREFIX.idx

 private:
  std::string prefix_;
  IndexedDType dtype_;
  std::string data_;                 // .bin contents
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> documents_ = {0};
};

class IndexedDataset {
 public:
  IndexedDataset(const std::string& prefix, int64_t vocab_size, const Storage& storage = Storage::defaults());

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  IndexedDType dtype() const { return dtype_; }
  const std::vector<int64_t>& document_boundaries() const { return documents_; }
  int64_t sequence_length(int64_t index) const { return lengths_[static_cast<size_t>(index)]; }
  // Tokens [offset, offset + count) of sequence `index`, appended to `out`.
  void read(int64_t index, int64_t offset, int64_t count, std::vector<int32_t>& out) const;
  // Several such ranges, concatenated into `out` (exactly their total size), with one read_many of
  // the .bin: on S3 the ranges are fetched concurrently.
  struct TokenRange {
    int64_t sequence = 0, offset = 0, count = 0;
  };
  void read_many(std::span<const TokenRange> ranges, std::span<int32_t> out) const;

 private:
  // Every token below vocab_size_, else an error naming .bin, the byte offset and the sequence.
  void check_vocabulary(std::span<const int32_t> tokens, int64_t index, uint64_t byte_offset) const;

  std::unique_ptr<RandomAccessFile> bin_;
  int64_t vocab_size_ = 0;
  IndexedDType dtype_ = IndexedDType::UInt16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> documents_;
  int64_t num_tokens_ = 0;
};

// uint16 when every id fits (Megatron's best_fitting_dtype: vocabulary below 65500), else int32.
IndexedDType best_fitting_dtype(int64_t vocab_size);

}  // namespace kiln
