#include "kiln/data/indexed_dataset.h"

#include <algorithm>
#include <cstring>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

size_t element_size(IndexedDType dtype) { return dtype == IndexedDType::UInt16 ? 2 : 4; }

template <typename T>
T read_at(const uint8_t* data, size_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof(T));
  return value;
}

}  // namespace

IndexedDType best_fitting_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::UInt16 : IndexedDType::Int32;
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, IndexedDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  pointers_.push_back(static_cast<int64_t>(data_.size()));
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  for (int32_t token : tokens) {
    if (dtype_ == IndexedDType::UInt16) {
      KILN_CHECK(token >= 0 && token <= 0xffff, "{}: token {} does not fit uint16", prefix_, token);
      const auto value = static_cast<uint16_t>(token);
      data_.append(reinterpret_cast<const char*>(&value), sizeof(value));
    } else {
      data_.append(reinterpret_cast<const char*>(&token), sizeof(token));
    }
  }
  documents_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::finish() {
  AtomicFile bin(prefix_ + ".bin");
  bin.write(data_.data(), data_.size());
  bin.commit();
  AtomicFile idx(prefix_ + ".idx");
  const uint64_t version = 1, sequences = lengths_.size(), documents = documents_.size();
  const auto code = static_cast<uint8_t>(dtype_);
  idx.write(kMagic, sizeof(kMagic));
  idx.write(&version, sizeof(version));
  idx.write(&code, sizeof(code));
  idx.write(&sequences, sizeof(sequences));
  idx.write(&documents, sizeof(documents));
  idx.write(lengths_.data(), lengths_.size() * sizeof(int32_t));
  idx.write(pointers_.data(), pointers_.size() * sizeof(int64_t));
  idx.write(documents_.data(), documents_.size() * sizeof(int64_t));
  idx.commit();
}

IndexedDataset::IndexedDataset(const std::string& prefix, int64_t vocab_size, const Storage& storage)
    : vocab_size_(vocab_size) {
  const std::string idx = prefix + ".idx";
  bin_ = storage.open(prefix + ".bin");
  const std::string index = storage.read_all(idx);
  const auto* data = reinterpret_cast<const uint8_t*>(index.data());
  KILN_CHECK(index.size() >= kHeaderBytes, "{}: truncated index: {} bytes, the header alone is {}", idx, index.size(),
             kHeaderBytes);
  KILN_CHECK(std::memcmp(data, kMagic, sizeof(kMagic)) == 0, "{}: bad magic at offset 0: not a Megatron MMIDIDX index",
             idx);
  const auto version = read_at<uint64_t>(data, 9);
  KILN_CHECK(version == 1, "{}: unsupported index version {} at offset 9", idx, version);
  const uint8_t code = data[17];
  KILN_CHECK(code == 8 || code == 4, "{}: dtype code {} at offset 17 is not uint16 (8) or int32 (4)", idx, code);
  dtype_ = static_cast<IndexedDType>(code);
  const auto sequences = read_at<uint64_t>(data, 18);
  const auto documents = read_at<uint64_t>(data, 26);
  const size_t expected = kHeaderBytes + sequences * (4 + 8) + documents * 8;
  KILN_CHECK(sequences < (uint64_t{1} << 40) && documents < (uint64_t{1} << 40) && index.size() == expected,
             "{}: header declares {} sequences and {} document entries ({} bytes) but the file has {} bytes", idx,
             sequences, documents, expected, index.size());
  KILN_CHECK(documents >= 1, "{}: no document boundaries", idx);
  lengths_.resize(sequences);
  pointers_.resize(sequences);
  documents_.resize(documents);
  if (sequences > 0) {  // (an empty vector's data() may be null, which memcpy may not be given)
    std::memcpy(lengths_.data(), data + kHeaderBytes, sequences * 4);
    std::memcpy(pointers_.data(), data + kHeaderBytes + sequences * 4, sequences * 8);
  }
  std::memcpy(documents_.data(), data + kHeaderBytes + sequences * 12, documents * 8);
  const size_t size = element_size(dtype_);
  for (size_t i = 0; i < sequences; ++i) {
    KILN_CHECK(lengths_[i] >= 0 && pointers_[i] >= 0 &&
                   static_cast<uint64_t>(pointers_[i]) + static_cast<uint64_t>(lengths_[i]) * size <= bin_->size(),
               "{}: sequence {} ({} tokens at byte {}) runs past the end of {} ({} bytes)", idx, i, lengths_[i],
               pointers_[i], bin_->name(), bin_->size());
    num_tokens_ += lengths_[i];
  }
  KILN_CHECK(documents_.front() == 0, "{}: the first document boundary is {}, not 0", idx, documents_.front());
  for (size_t d = 1; d < documents; ++d)
    KILN_CHECK(documents_[d] >= documents_[d - 1], "{}: document boundary {} decreases ({} after {})", idx, d,
               documents_[d], documents_[d - 1]);
  KILN_CHECK(documents_.back() == static_cast<int64_t>(sequences), "{}: the last document boundary is {}, not the {} sequences",
             idx, documents_.back(), sequences);
  if (vocab_size <= 0 || bin_->mapped() == nullptr) return;  // remote: tokens are checked as they are read
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < sequences; ++i) {
    tokens.clear();
    read(static_cast<int64_t>(i), 0, lengths_[i], tokens);
    check_vocabulary(tokens, static_cast<int64_t>(i), static_cast<uint64_t>(pointers_[i]));
  }
}

void IndexedDataset::check_vocabulary(std::span<const int32_t> tokens, int64_t index, uint64_t byte_offset) const {
  const size_t size = element_size(dtype_);
  for (size_t t = 0; t < tokens.size(); ++t)
    KILN_CHECK(tokens[t] >= 0 && tokens[t] < vocab_size_,
               "{}: token {} at byte offset {} (sequence {}) is outside the vocabulary [0, {})", bin_->name(), tokens[t],
               byte_offset + t * size, index, vocab_size_);
}

void IndexedDataset::read(int64_t index, int64_t offset, int64_t count, std::vector<int32_t>& out) const {
  const size_t first = out.size();
  out.resize(first + static_cast<size_t>(std::max<int64_t>(count, 0)));
  const TokenRange range{index, offset, count};
  read_many(std::span(&range, 1), std::span(out).subspan(first));
}

void IndexedDataset::read_many(std::span<const TokenRange> ranges, std::span<int32_t> out) const {
  const size_t size = element_size(dtype_);
  int64_t total = 0;
  for (const TokenRange& range : ranges) {
    KILN_CHECK(range.sequence >= 0 && range.sequence < num_sequences() && range.offset >= 0 && range.count >= 0 &&
                   range.offset + range.count <= lengths_[static_cast<size_t>(range.sequence)],
               "{}: read of tokens [{}, {}) of sequence {} is out of range", bin_->name(), range.offset,
               range.offset + range.count, range.sequence);
    total += range.count;
  }
  KILN_CHECK(total == static_cast<int64_t>(out.size()), "{}: {} tokens requested into room for {}", bin_->name(),
             total, out.size());
  const auto byte_offset = [&](const TokenRange& range) {
    return static_cast<uint64_t>(pointers_[static_cast<size_t>(range.sequence)]) +
           static_cast<uint64_t>(range.offset) * size;
  };
  // The bytes of every range, back to back: straight from the map, or fetched in one read_many.
  const uint8_t* bytes = bin_->mapped();
  thread_local std::vector<uint8_t> buffer;
  thread_local std::vector<ReadRange> reads;
  if (bytes == nullptr) {
    buffer.resize(static_cast<size_t>(total) * size);
    reads.clear();
    size_t at = 0;
    for (const TokenRange& range : ranges) {
      const size_t length = static_cast<size_t>(range.count) * size;
      reads.push_back({byte_offset(range), std::span(buffer).subspan(at, length)});
      at += length;
    }
    bin_->read_many(reads);
  }
  size_t next = 0, at = 0;
  for (const TokenRange& range : ranges) {
    const uint8_t* base = bytes ? bytes + byte_offset(range) : buffer.data() + at;
    const size_t first = next;
    for (int64_t t = 0; t < range.count; ++t)
      out[next++] = dtype_ == IndexedDType::UInt16 ? read_at<uint16_t>(base, static_cast<size_t>(t) * 2)
                                                   : read_at<int32_t>(base, static_cast<size_t>(t) * 4);
    at += static_cast<size_t>(range.count) * size;
    if (vocab_size_ > 0 && bytes == nullptr)  // a mapped .bin was checked whole on open
      check_vocabulary(out.subspan(first, next - first), range.sequence, byte_offset(range));
  }
}

}  // namespace kiln
