// A read-only memory map of a whole file, released on destruction. Open failures are
// kiln::Errors naming the path and the system's reason. Movable, not copyable.
// Also the two primitives every local reader here uses: open_read_only() (descriptor and size,
// errors naming the path) and pread_fully() (loops over short reads and EINTR).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <span>

namespace kiln {

struct ReadOnlyFile {
  int fd = -1;
  uint64_t size = 0;
};
ReadOnlyFile open_read_only(const std::string& path);
// Reads out.size() bytes at offset; false at end of file or on an error (errno tells which).
bool pread_fully(int fd, std::span<uint8_t> out, uint64_t offset);

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln
