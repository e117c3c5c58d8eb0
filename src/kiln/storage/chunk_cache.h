// ChunkCachedFile: a remote file (S3) behind a local cache directory (an NVMe scratch disk), filled
// lazily: the file is divided into fixed chunks; a read serves the chunks already on disk with
// pread and fetches the missing ones from the remote file (all at once, so they are in flight
// together), then writes each to its own file by rename. Later epochs read only local disk.
//
// Layout: <cache_dir>/objects/<16 hex digits>/chunk-<8 digits>, where the hex digits hash the
// remote name, size and ETag, so a changed object never serves stale chunks; `source.txt` in the
// folder names the object. A chunk file holds the chunk's bytes, then their 64-bit hash
// (hash_bytes, little-endian). A chunk file of the wrong size (a crash mid-write, or an older
// layout without the hash) or whose bytes fail their hash (damaged on disk) is never served: it is
// fetched again and rewritten. Each chunk file is verified in full the first time this object reads
// it, then read piece by piece. The cache is not bounded: it grows to the bytes read. Thread-safe;
// concurrent misses of one chunk both fetch it and the second rename wins harmlessly.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "kiln/storage/random_access_file.h"

namespace kiln {

struct ChunkCacheStats {
  uint64_t local_reads = 0;     // pieces of reads served from chunk files on disk
  uint64_t chunks_fetched = 0;  // chunks fetched from the remote file (and written to disk)
  uint64_t bytes_fetched = 0;
  uint64_t damaged_chunks = 0;  // chunk files of the right size that failed their hash (fetched again)
};

class ChunkCachedFile final : public RandomAccessFile {
 public:
  // identity: what makes the remote content unique (name, size, ETag).
  ChunkCachedFile(std::unique_ptr<RandomAccessFile> remote, const std::string& cache_dir, const std::string& identity,
                  uint64_t chunk_bytes);

  const std::string& name() const override { return remote_->name(); }
  uint64_t size() const override { return remote_->size(); }
  void read(uint64_t offset, std::span<uint8_t> out) const override;
  void read_many(std::span<const ReadRange> ranges) const override;
  ChunkCacheStats stats() const;
  const std::string& folder() const { return folder_; }

 private:
  std::string chunk_path(uint64_t chunk) const;
  uint64_t chunk_size(uint64_t chunk) const;
  // Copies `out` from `within` the chunk's file if it is there, whole and (the first time) passes
  // its hash; false when the chunk must be fetched.
  bool read_local(uint64_t chunk, uint64_t within, std::span<uint8_t> out) const;

  std::unique_ptr<RandomAccessFile> remote_;
  std::string folder_;
  uint64_t chunk_bytes_;
  std::unique_ptr<std::atomic<bool>[]> verified_;  // per chunk: its file passed its hash
  mutable std::atomic<uint64_t> hits_{0}, misses_{0}, fetched_{0}, damaged_{0};
};

}  // namespace kiln
