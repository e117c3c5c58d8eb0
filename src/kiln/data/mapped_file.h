// A read-only memory map of a whole file, released on destruction. Open failures are
// kiln::Errors naming the path and the system's reason. Movable, not copyable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

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
