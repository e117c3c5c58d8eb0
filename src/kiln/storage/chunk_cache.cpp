#include "kiln/storage/chunk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/storage/mapped_file.h"

namespace kiln {
namespace {

constexpr uint64_t kHashBytes = sizeof(uint64_t);  // the trailer after a chunk's bytes

// What a chunk file holds: the chunk, then its hash.
enum class ChunkFile { Missing, Whole, Damaged };

// Reads out.size() bytes at `within` of a chunk file whose chunk has `chunk_bytes` bytes: Missing
// when the file is absent or not chunk_bytes + 8 long (torn, or an older layout), and with
// `verify` the whole file is read first and Damaged when the chunk fails its hash.
ChunkFile read_from_chunk_file(const std::string& path, uint64_t chunk_bytes, bool verify, uint64_t within,
                               std::span<uint8_t> out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ChunkFile::Missing;
  struct stat info {};
  ChunkFile result = ChunkFile::Missing;
  if (::fstat(fd, &info) == 0 && static_cast<uint64_t>(info.st_size) == chunk_bytes + kHashBytes) {
    if (!verify) {
      result = pread_fully(fd, out, within) ? ChunkFile::Whole : ChunkFile::Missing;
    } else {
      std::vector<uint8_t> file(chunk_bytes + kHashBytes);
      if (pread_fully(fd, file, 0)) {
        uint64_t stored = 0;
        std::memcpy(&stored, file.data() + chunk_bytes, kHashBytes);
        result = stored == hash_bytes(file.data(), chunk_bytes) ? ChunkFile::Whole : ChunkFile::Damaged;
        if (result == ChunkFile::Whole) std::memcpy(out.data(), file.data() + within, out.size());
      }
    }
  }
  ::close(fd);
  return result;
}

// Writes a chunk and its hash under a temporary name, then renames it into place. No fsync: a
// chunk lost or torn by a crash is detected by its size, or its hash, and fetched again.
void write_chunk_file(const std::string& path, std::span<const uint8_t> chunk) {
  const uint64_t hash = hash_bytes(chunk.data(), chunk.size());
  const std::span<const uint8_t> hash_part(reinterpret_cast<const uint8_t*>(&hash), kHashBytes);
  const std::string temp = fmt::format("{}.tmp-{}-{:x}", path, ::getpid(),
                                       std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "data cache: cannot create '{}': {}", temp, std::strerror(errno));
  for (const std::span<const uint8_t> bytes : {chunk, hash_part}) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        const int saved = errno;
        ::close(fd);
        ::unlink(temp.c_str());
        fail("data cache: cannot write '{}': {}", temp, std::strerror(saved));
      }
      done += static_cast<size_t>(wrote);
    }
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp.c_str());
    fail("data cache: cannot rename '{}' to '{}': {}", temp, path, std::strerror(saved));
  }
}

}  // namespace

ChunkCachedFile::ChunkCachedFile(std::unique_ptr<RandomAccessFile> remote, const std::string& cache_dir,
                                 const std::string& identity, uint64_t chunk_bytes)
    : remote_(std::move(remote)), chunk_bytes_(chunk_bytes) {
  KILN_CHECK(chunk_bytes_ > 0, "data cache: chunk size must be positive");
  verified_ = std::make_unique<std::atomic<bool>[]>((size() + chunk_bytes_ - 1) / chunk_bytes_);
  folder_ = fmt::format("{}/objects/{:016x}", cache_dir, hash_string(identity));
  std::error_code error;
  std::filesystem::create_directories(folder_, error);
  KILN_CHECK(!error, "data cache: cannot create '{}': {}", folder_, error.message());
  if (!std::filesystem::exists(folder_ + "/source.txt"))
    write_file_atomically(folder_ + "/source.txt", identity + "\n");
}

std::string ChunkCachedFile::chunk_path(uint64_t chunk) const { return fmt::format("{}/chunk-{:08d}", folder_, chunk); }

uint64_t ChunkCachedFile::chunk_size(uint64_t chunk) const {
  return std::min(chunk_bytes_, size() - chunk * chunk_bytes_);
}

bool ChunkCachedFile::read_local(uint64_t chunk, uint64_t within, std::span<uint8_t> out) const {
  const bool verify = !verified_[chunk].load();
  switch (read_from_chunk_file(chunk_path(chunk), chunk_size(chunk), verify, within, out)) {
    case ChunkFile::Whole:
      verified_[chunk] = true;
      return true;
    case ChunkFile::Damaged: ++damaged_; return false;
    case ChunkFile::Missing: return false;
  }
  return false;
}

void ChunkCachedFile::read(uint64_t offset, std::span<uint8_t> out) const {
  const ReadRange range{offset, out};
  read_many({&range, 1});
}

void ChunkCachedFile::read_many(std::span<const ReadRange> ranges) const {
  // Each range is cut at chunk borders; a piece whose chunk is on disk is read from it, the others
  // wait for their chunk, and all missing chunks are fetched together.
  struct Piece {
    uint64_t chunk, within;
    std::span<uint8_t> out;
  };
  std::vector<Piece> waiting;
  std::map<uint64_t, std::vector<uint8_t>> fetched;
  for (const ReadRange& range : ranges) {
    check_range(range.offset, range.out.size());
    for (uint64_t done = 0; done < range.out.size();) {
      const uint64_t position = range.offset + done;
      const Piece piece{position / chunk_bytes_, position % chunk_bytes_,
                        range.out.subspan(done, std::min<uint64_t>(chunk_bytes_ - position % chunk_bytes_,
                                                                   range.out.size() - done))};
      done += piece.out.size();
      if (!fetched.contains(piece.chunk) && read_local(piece.chunk, piece.within, piece.out)) {
        ++hits_;
        continue;
      }
      waiting.push_back(piece);
      fetched.try_emplace(piece.chunk);
    }
  }
  if (waiting.empty()) return;
  std::vector<ReadRange> missing;
  for (auto& [chunk, bytes] : fetched) {
    bytes.resize(chunk_size(chunk));
    missing.push_back({chunk * chunk_bytes_, bytes});
  }
  remote_->read_many(missing);
  for (const ReadRange& chunk : missing) {
    write_chunk_file(chunk_path(chunk.offset / chunk_bytes_), chunk.out);
    verified_[chunk.offset / chunk_bytes_] = true;  // the file now holds what was just fetched
    fetched_ += chunk.out.size();
    ++misses_;
  }
  for (const Piece& piece : waiting) {
    const std::vector<uint8_t>& bytes = fetched.at(piece.chunk);
    std::memcpy(piece.out.data(), bytes.data() + piece.within, piece.out.size());
  }
}

ChunkCacheStats ChunkCachedFile::stats() const {
  return {hits_.load(), misses_.load(), fetched_.load(), damaged_.load()};
}

}  // namespace kiln
