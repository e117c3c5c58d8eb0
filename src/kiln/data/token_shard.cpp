#include "kiln/data/token_shard.h"

#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/atomic_file.h"

namespace kiln {

TokenShard::TokenShard(const std::string& path, int64_t vocab_size) : file_(path) {
  KILN_CHECK(file_.size() >= kShardHeaderBytes,
             "{}: truncated shard: {} bytes is shorter than the {}-byte header", path, file_.size(),
             kShardHeaderBytes);
  int32_t header[3];
  std::memcpy(header, file_.data(), sizeof(header));
  KILN_CHECK(header[0] == kShardMagic, "{}: bad magic {} at offset 0 (expected {}): not a token shard",
             path, header[0], kShardMagic);
  KILN_CHECK(header[1] == kShardVersion, "{}: unsupported shard version {} at offset 4 (expected {})",
             path, header[1], kShardVersion);
  const int64_t declared = header[2];
  const size_t payload = file_.size() - kShardHeaderBytes;
  KILN_CHECK(declared >= 0 && payload == static_cast<size_t>(declared) * sizeof(uint16_t),
             "{}: header at offset 8 declares {} tokens ({} bytes) but the file holds {} bytes of "
             "tokens (truncated or corrupt)",
             path, declared, declared * 2, payload);
  count_ = declared;
  tokens_ = reinterpret_cast<const uint16_t*>(file_.data() + kShardHeaderBytes);
  for (int64_t i = 0; i < count_; ++i)
    KILN_CHECK(tokens_[i] < vocab_size, "{}: token {} at byte offset {} is outside the vocabulary [0, {})",
               path, tokens_[i], kShardHeaderBytes + static_cast<size_t>(i) * 2, vocab_size);
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  KILN_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "{}: {} tokens exceed one shard's limit",
             path, tokens.size());
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFile file(path);
  file.write(header, sizeof(header));
  file.write(tokens.data(), tokens.size_bytes());
  file.commit();
}

}  // namespace kiln
