// Storage: one front door for data files, local or on S3. A path that starts with s3:// is an S3
// object (s3_client.h: credentials, endpoint and region from the AWS_* environment variables);
// anything else is a local path, read through a memory map or pread (StorageOptions::local_io).
// With a cache_dir, S3 objects are read through a lazily filled chunk cache on local disk
// (chunk_cache.h). Datasets take a Storage and use open/list/exists/read_all only, so
// `--data-path s3://bucket/prefix` works wherever a local path does.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/storage/random_access_file.h"
#include "kiln/storage/s3_client.h"

namespace kiln {

enum class LocalIo { Mmap, Pread };
LocalIo parse_local_io(const std::string& text);  // "mmap" or "pread"

struct StorageOptions {
  LocalIo local_io = LocalIo::Mmap;
  std::string cache_dir;                  // empty: S3 reads are never cached on disk
  uint64_t cache_chunk_bytes = 4ull << 20;
  S3Addressing s3_addressing = S3Addressing::Auto;
  std::optional<S3Settings> s3;           // set: used instead of the environment (tests, benches)
};

class Storage {
 public:
  explicit Storage(StorageOptions options = {});
  // Local paths with default options, S3 from the environment: for callers given no Storage.
  static const Storage& defaults();

  const StorageOptions& options() const { return options_; }
  std::unique_ptr<RandomAccessFile> open(const std::string& path) const;
  bool exists(const std::string& path) const;
  // Names (not paths) of the files directly inside folder `dir`, sorted; errors name the folder.
  std::vector<std::string> list(const std::string& dir) const;
  std::string read_all(const std::string& path) const;
  // A value that changes when the file's content may have changed (size and mtime, or ETag).
  std::string fingerprint(const std::string& path) const;
  // A local folder for files derived from `path` (index caches): `path + suffix` for local data;
  // for S3 data a folder under cache_dir, or "" when there is no cache_dir.
  std::string derived_folder(const std::string& path, const std::string& suffix) const;
  // The S3 client, created on first use from the environment.
  std::shared_ptr<const S3Client> s3() const;

 private:
  StorageOptions options_;
  mutable std::once_flag s3_once_;
  mutable std::shared_ptr<const S3Client> s3_;
};

}  // namespace kiln
