#include "kiln/train/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::TempDir;

TEST(Safetensors, RoundTripsWithAlignedHeader) {
  TempDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<uint16_t> b = {7, 8};
  write_safetensors(dir / "x.safetensors",
                    {{"a", DType::F32, Shape{2, 3}, a.data()}, {"b", DType::BF16, Shape{2}, b.data()}},
                    {{"format", "pt"}});
  std::ifstream stream(dir / "x.safetensors", std::ios::binary);
  uint64_t header_length = 0;
  stream.read(reinterpret_cast<char*>(&header_length), 8);
  EXPECT_EQ(header_length % 8, 0u);
  SafetensorsFile file(dir / "x.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const SafetensorsEntry& entry = file.get("a");
  EXPECT_EQ(entry.shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(entry.data, a.data(), 24), 0);
  EXPECT_EQ(file.get("b").dtype, DType::BF16);
  EXPECT_THROW(file.get("c"), Error);
}

TEST(Safetensors, TruncatedOrCorruptFilesAreNamed) {
  TempDir dir;
  const std::vector<float> a(100, 1.0f);
  write_safetensors(dir / "x.safetensors", {{"a", DType::F32, Shape{100}, a.data()}});
  std::ifstream in(dir / "x.safetensors", std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), {}};
  std::ofstream(dir / "cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  try {
    SafetensorsFile file(dir / "cut.safetensors");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cut.safetensors: tensor 'a'"), std::string::npos) << error.what();
  }
  std::string corrupt = bytes;
  corrupt[8] = '#';  // the header's opening brace
  std::ofstream(dir / "bad.safetensors", std::ios::binary) << corrupt;
  EXPECT_THROW(SafetensorsFile(dir / "bad.safetensors"), Error);
  std::ofstream(dir / "tiny.safetensors", std::ios::binary) << "abc";
  EXPECT_THROW(SafetensorsFile(dir / "tiny.safetensors"), Error);
}

TEST(AtomicFile, UncommittedWriteLeavesOldFileAndNoTemporary) {
  TempDir dir;
  write_file_atomically(dir / "state.json", "old");
  {
    AtomicFile file(dir / "state.json");
    file.write("new, half written", 5);
  }  // destroyed without commit, as after an exception mid-save
  std::ifstream stream(dir / "state.json");
  std::string contents{std::istreambuf_iterator<char>(stream), {}};
  EXPECT_EQ(contents, "old");
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace kiln
