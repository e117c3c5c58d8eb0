// RandomAccessFile: the bytes of one data file, wherever it lives (local disk via pread or a
// memory map, S3, S3 behind a local cache). Datasets read through this interface only, so every
// storage serves every dataset format. Reads past the end are kiln::Errors naming the file.
// Implementations are thread-safe for concurrent reads.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kiln {

struct ReadRange {
  uint64_t offset = 0;
  std::span<uint8_t> out;  // reads out.size() bytes at offset
};

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  virtual const std::string& name() const = 0;  // path or s3:// URI, for messages
  virtual uint64_t size() const = 0;
  virtual void read(uint64_t offset, std::span<uint8_t> out) const = 0;
  // Several ranges at once; remote files fetch them concurrently. The default reads one by one.
  virtual void read_many(std::span<const ReadRange> ranges) const {
    for (const ReadRange& range : ranges) read(range.offset, range.out);
  }
  // The whole file in memory when it is memory-mapped, else nullptr (then use read()).
  virtual const uint8_t* mapped() const { return nullptr; }

 protected:
  void check_range(uint64_t offset, uint64_t bytes) const;
};

}  // namespace kiln
