// AtomicFile: writes go to "<path>.tmp-<pid>" in the same folder; commit() flushes, fsyncs and
// renames onto <path>, then fsyncs the folder, so a crash leaves either the old file or the
// complete new one under the real name, never a half-written file. Destroying an uncommitted
// AtomicFile removes the temporary. Write errors (disk full, ...) are kiln::Errors naming the path.
// fsync_directory() makes a rename inside `dir` durable.
#pragma once

#include <cstddef>
#include <string>

namespace kiln {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
};

void fsync_directory(const std::string& dir);
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace kiln
