// Token shards in llm.c's format: a 1024-byte header of 256 little-endian int32 (magic 20240520,
// version 1, token count, rest zero), then `token count` uint16 tokens.
//
// TokenShard opens a shard through a Storage (local map or pread, or S3) and validates it on
// open: header present, magic, version, the token count against the file size. Tokens are
// checked against `vocab_size` on open when the file is memory-mapped (a cheap scan), otherwise
// as they are read (no full download of a remote shard). Each failure is a kiln::Error naming the
// file and the byte offset.
// write_token_shard writes atomically: a temporary file in the same folder, fsync, rename.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <memory>
#include <vector>

#include "kiln/storage/storage.h"

namespace kiln {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);

class TokenShard {
 public:
  TokenShard(const std::string& path, int64_t vocab_size, const Storage& storage = Storage::defaults());

  int64_t size() const { return count_; }
  const std::string& path() const { return file_->name(); }
  // Tokens [first, first + out.size()) of the shard. Thread-safe.
  void read(int64_t first, std::span<int32_t> out) const;

 private:
  std::unique_ptr<RandomAccessFile> file_;
  int64_t count_ = 0;
  int64_t vocab_size_ = 0;
};

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace kiln
