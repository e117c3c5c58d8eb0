#include "kiln/data/token_shard.h"

#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/atomic_file.h"

namespace kiln {

TokenShard::TokenShard(const std::string& path, int64_t vocab_size, const Storage& storage)
    : file_(storage.open(path)), vocab_size_(vocab_size) {
  const uint64_t bytes = file_->size();
  KILN_CHECK(bytes >= kShardHeaderBytes, "{}: truncated shard: {} bytes is shorter than the {}-byte header", path,
             bytes, kShardHeaderBytes);
  int32_t header[3];
  file_->read(0, {reinterpret_cast<uint8_t*>(header), sizeof(header)});
  KILN_CHECK(header[0] == kShardMagic, "{}: bad magic {} at offset 0 (expected {}): not a token shard",
             path, header[0], kShardMagic);
  KILN_CHECK(header[1] == kShardVersion, "{}: unsupported shard version {} at offset 4 (expected {})",
             path, header[1], kShardVersion);
  const int64_t declared = header[2];
  const uint64_t payload = bytes - kShardHeaderBytes;
  KILN_CHECK(declared >= 0 && payload == static_cast<uint64_t>(declared) * sizeof(uint16_t),
             "{}: header at offset 8 declares {} tokens ({} bytes) but the file holds {} bytes of "
             "tokens (truncated or corrupt)",
             path, declared, declared * 2, payload);
  count_ = declared;
  if (const uint8_t* mapped = file_->mapped()) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(mapped + kShardHeaderBytes);
    for (int64_t i = 0; i < count_; ++i)
      KILN_CHECK(tokens[i] < vocab_size, "{}: token {} at byte offset {} is outside the vocabulary [0, {})",
                 path, tokens[i], kShardHeaderBytes + static_cast<size_t>(i) * 2, vocab_size);
  }
}

void TokenShard::read(int64_t first, std::span<int32_t> out) const {
  const auto count = static_cast<int64_t>(out.size());
  KILN_CHECK(first >= 0 && first + count <= count_, "{}: read of tokens [{}, {}) outside the shard's {}", path(),
             first, first + count, count_);
  const uint64_t offset = kShardHeaderBytes + static_cast<uint64_t>(first) * 2;
  if (const uint8_t* mapped = file_->mapped()) {  // validated on open
    const auto* tokens = reinterpret_cast<const uint16_t*>(mapped + offset);
    for (size_t i = 0; i < out.size(); ++i) out[i] = tokens[i];
    return;
  }
  thread_local std::vector<uint16_t> buffer;
  buffer.resize(out.size());
  file_->read(offset, {reinterpret_cast<uint8_t*>(buffer.data()), buffer.size() * 2});
  for (size_t i = 0; i < out.size(); ++i) {
    KILN_CHECK(buffer[i] < vocab_size_, "{}: token {} at byte offset {} is outside the vocabulary [0, {})", path(),
               buffer[i], offset + i * 2, vocab_size_);
    out[i] = buffer[i];
  }
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
