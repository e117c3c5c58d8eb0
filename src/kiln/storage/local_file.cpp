#include "kiln/storage/local_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/data/mapped_file.h"

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
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    KILN_CHECK(fd_ >= 0, "cannot open '{}': {}", path, std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const int saved = errno;
      ::close(fd_);
      fail("cannot stat '{}': {}", path, std::strerror(saved));
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~PreadFile() override { ::close(fd_); }

  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, std::span<uint8_t> out) const override {
    check_range(offset, out.size());
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t got = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      KILN_CHECK(got > 0, "{}: read of {} bytes at offset {} failed: {}", path_, out.size(), offset,
                 got == 0 ? "unexpected end of file (truncated while open?)" : std::strerror(errno));
      done += static_cast<size_t>(got);
    }
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
