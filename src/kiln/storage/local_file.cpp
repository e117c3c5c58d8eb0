#include "kiln/storage/local_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/storage/mapped_file.h"

namespace kiln {

void RandomAccessFile::check_range(uint64_t offset, uint64_t bytes) const {
  KILN_CHECK(offset <= size() && bytes <= size() - offset,
             "{}: read of {} bytes at offset {} runs past the end of the file ({} bytes)", name(), bytes, offset,
             size());
}

namespace {

class PreadFile final : public RandomAccessFile {
 public:
  explicit PreadFile(const std::string& path) : path_(path) {
    const ReadOnlyFile file = open_read_only(path);
    fd_ = file.fd;
    size_ = file.size;
  }
  ~PreadFile() override { ::close(fd_); }

  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, std::span<uint8_t> out) const override {
    check_range(offset, out.size());
    errno = 0;
    KILN_CHECK(pread_fully(fd_, out, offset), "{}: read of {} bytes at offset {} failed: {}", path_, out.size(), offset,
               errno == 0 ? "unexpected end of file (truncated while open?)" : std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

class MmapFile final : public RandomAccessFile {
 public:
  explicit MmapFile(const std::string& path) : file_(path) {}
  const std::string& name() const override { return file_.path(); }
  uint64_t size() const override { return file_.size(); }
  void read(uint64_t offset, std::span<uint8_t> out) const override {
    check_range(offset, out.size());
    if (!out.empty()) std::memcpy(out.data(), file_.data() + offset, out.size());
  }
  const uint8_t* mapped() const override { return file_.data(); }

 private:
  MappedFile file_;
};

}  // namespace

std::unique_ptr<RandomAccessFile> open_pread_file(const std::string& path) { return std::make_unique<PreadFile>(path); }
std::unique_ptr<RandomAccessFile> open_mmap_file(const std::string& path) { return std::make_unique<MmapFile>(path); }

}  // namespace kiln
