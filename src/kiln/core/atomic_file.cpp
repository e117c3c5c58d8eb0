#include "kiln/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kiln/core/error.h"

namespace kiln {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_path_ = path_ + ".tmp-" + std::to_string(::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, "cannot create '{}': {}", temp_path_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  KILN_CHECK(fd_ >= 0, "write to '{}' after commit", path_);
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd_, cursor, bytes);
    if (written < 0 && errno == EINTR) continue;
    KILN_CHECK(written > 0, "cannot write '{}': {}", temp_path_, std::strerror(errno));
    cursor += written;
    bytes -= static_cast<size_t>(written);
  }
}

void AtomicFile::commit() {
  KILN_CHECK(fd_ >= 0, "'{}' committed twice", path_);
  KILN_CHECK(::fsync(fd_) == 0, "cannot flush '{}': {}", temp_path_, std::strerror(errno));
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0 || ::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp_path_.c_str());
    fail("cannot write '{}': {}", path_, std::strerror(saved));
  }
  fsync_directory(std::filesystem::path(path_).parent_path().string());
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "cannot open folder '{}': {}", dir, std::strerror(errno));
  const int synced = ::fsync(fd);
  ::close(fd);
  KILN_CHECK(synced == 0, "cannot flush folder '{}': {}", dir, std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace kiln
