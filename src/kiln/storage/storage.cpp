#include "kiln/storage/storage.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/storage/chunk_cache.h"
#include "kiln/storage/local_file.h"
#include "kiln/storage/s3_file.h"

namespace kiln {
namespace fs = std::filesystem;

LocalIo parse_local_io(const std::string& text) {
  if (text == "mmap") return LocalIo::Mmap;
  if (text == "pread") return LocalIo::Pread;
  fail("config key 'data_io': '{}' is not mmap or pread", text);
}

Storage::Storage(StorageOptions options) : options_(std::move(options)) {}

const Storage& Storage::defaults() {
  static const Storage storage;
  return storage;
}

std::shared_ptr<const S3Client> Storage::s3() const {
  std::call_once(s3_once_, [this] {
    S3Settings settings = options_.s3 ? *options_.s3 : S3Settings::from_environment();
    if (!options_.s3) settings.addressing = options_.s3_addressing;
    s3_ = std::make_shared<const S3Client>(std::move(settings));
  });
  return s3_;
}

std::unique_ptr<RandomAccessFile> Storage::open(const std::string& path) const {
  if (!is_s3_uri(path)) return options_.local_io == LocalIo::Mmap ? open_mmap_file(path) : open_pread_file(path);
  auto object = std::make_unique<S3File>(s3(), path);
  if (options_.cache_dir.empty()) return object;
  const std::string identity = fmt::format("{} size {} etag {}", path, object->size(), object->etag());
  return std::make_unique<ChunkCachedFile>(std::move(object), options_.cache_dir, identity, options_.cache_chunk_bytes);
}

bool Storage::exists(const std::string& path) const {
  if (!is_s3_uri(path)) {
    std::error_code error;
    return fs::is_regular_file(path, error);
  }
  const S3Location location = parse_s3_uri(path);
  return !location.key.empty() && s3()->head(location).has_value();
}

std::vector<std::string> Storage::list(const std::string& dir) const {
  std::vector<std::string> names;
  if (is_s3_uri(dir)) {
    S3Location location = parse_s3_uri(dir);
    if (!location.key.empty() && location.key.back() != '/') location.key += '/';
    for (const S3ObjectInfo& object : s3()->list(location.bucket, location.key))
      if (object.key.size() > location.key.size()) names.push_back(object.key.substr(location.key.size()));
  } else {
    std::error_code error;
    KILN_CHECK(fs::is_directory(dir, error), "'{}' is not a folder", dir);
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.is_regular_file()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string Storage::read_all(const std::string& path) const {
  if (is_s3_uri(path)) return s3()->get(parse_s3_uri(path));
  const auto file = open_pread_file(path);
  std::string text(file->size(), '\0');
  file->read(0, {reinterpret_cast<uint8_t*>(text.data()), text.size()});
  return text;
}

std::string Storage::fingerprint(const std::string& path) const {
  if (is_s3_uri(path)) {
    const auto info = s3()->head(parse_s3_uri(path));
    KILN_CHECK(info.has_value(), "{}: not found (HTTP 404: no such object)", path);
    return fmt::format("{} {}", info->size, info->etag);
  }
  struct stat info {};
  KILN_CHECK(::stat(path.c_str(), &info) == 0, "cannot stat '{}'", path);
  return fmt::format("{} {}.{}", info.st_size, info.st_mtim.tv_sec, info.st_mtim.tv_nsec);
}

std::string Storage::derived_folder(const std::string& path, const std::string& suffix) const {
  if (!is_s3_uri(path)) return path + suffix;
  if (options_.cache_dir.empty()) return {};
  return fmt::format("{}/derived/{:016x}{}", options_.cache_dir, hash_string(path), suffix);
}

}  // namespace kiln
