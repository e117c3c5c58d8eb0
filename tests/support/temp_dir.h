// A fresh folder under the system temp dir, removed with everything in it on destruction, whole-file
// reads and writes, and small synthetic token datasets for trainer tests.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/data/token_shard.h"

namespace kiln::testing {

// A file's whole contents, and writing them (replacing the file).
inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("kiln-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes train_000000.bin, val_000000.bin and meta.json of a learnable toy language: a repeating
// pattern with noise, so losses fall quickly.
inline void write_toy_dataset(const std::string& dir, int64_t vocab_size, int64_t train_tokens,
                              int64_t val_tokens, uint64_t seed = 3) {
  Rng rng(seed);
  auto make = [&](int64_t count) {
    std::vector<uint16_t> tokens(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(
          rng.uniform() < 0.1f ? rng.below(static_cast<uint64_t>(vocab_size)) : (i * 7 / 3) % vocab_size);
    return tokens;
  };
  write_token_shard(dir + "/train_000000.bin", make(train_tokens));
  write_token_shard(dir + "/val_000000.bin", make(val_tokens));
  std::ofstream(dir + "/meta.json") << "{\"vocab_size\": " << vocab_size << "}\n";
}

}  // namespace kiln::testing
