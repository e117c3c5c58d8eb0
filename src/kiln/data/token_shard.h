// Token shards in llm.c's format: a 1024-byte header of 256 little-endian int32 (magic 20240520,
// version 1, token count, rest zero), then `token count` uint16 tokens.
//
// TokenShard maps a shard read-only and validates it on open: header present, magic, version,
// the token count against the file size, and every token below `vocab_size`. Each failure is a
// kiln::Error naming the file and the byte offset.
// write_token_shard writes atomically: a temporary file in the same folder, fsync, rename.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/data/mapped_file.h"

namespace kiln {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);

class TokenShard {
 public:
  TokenShard(const std::string& path, int64_t vocab_size);

  int64_t size() const { return count_; }
  const uint16_t* tokens() const { return tokens_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace kiln
