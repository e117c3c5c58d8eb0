#include "kiln/train/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "kiln/core/atomic_file.h"
#include "kiln/core/error.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
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

TEST(Safetensors, AFlippedBitInAKilnFileFailsItsTensorsChecksum) {
  TempDir dir;
  const std::vector<float> a(100, 1.0f), b(7, 2.0f);
  write_safetensors(dir / "x.safetensors", {{"a", DType::F32, Shape{100}, a.data()}, {"b", DType::F32, Shape{7}, b.data()}},
                    {{"format", "pt"}});
  EXPECT_EQ(SafetensorsFile(dir / "x.safetensors").metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const std::string valid = testing::read_file_bytes(dir / "x.safetensors");
  std::string flipped = valid;
  flipped[flipped.size() - 5] ^= 0x10;  // in b's last element
  testing::write_file_bytes(dir / "x.safetensors", flipped);
  EXPECT_NE(error_of([&] { SafetensorsFile file(dir / "x.safetensors"); })
                .find("x.safetensors: tensor 'b' fails its checksum: the file was damaged after it was written"),
            std::string::npos);
  // A checksum of a tensor the header no longer lists (a renamed entry) is an error too.
  std::string renamed = valid;
  renamed.replace(renamed.find("\"b\":{"), 5, "\"c\":{");
  testing::write_file_bytes(dir / "x.safetensors", renamed);
  EXPECT_NE(error_of([&] { SafetensorsFile file(dir / "x.safetensors"); })
                .find("metadata holds a checksum of tensor 'b', which the file does not have"),
            std::string::npos);
}

TEST(Safetensors, EmptyTensorsRoundTripWithTheirChecksums) {
  TempDir dir;
  write_safetensors(dir / "e.safetensors", {{"none", DType::F32, Shape{0}, nullptr}, {"flat", DType::BF16, Shape{3, 0}, nullptr}});
  const SafetensorsFile file(dir / "e.safetensors");
  EXPECT_EQ(file.get("none").shape, Shape{0});
  EXPECT_EQ(file.get("flat").shape, (Shape{3, 0}));
}

TEST(Safetensors, FilesWithoutChecksumsAreRead) {  // other writers' files, e.g. Hugging Face's
  TempDir dir;
  const std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const uint64_t length = header.size();
  const float values[2] = {1.5f, -2.0f};
  testing::write_file_bytes(dir / "hf.safetensors", std::string(reinterpret_cast<const char*>(&length), 8) + header +
                                                        std::string(reinterpret_cast<const char*>(values), 8));
  const SafetensorsFile file(dir / "hf.safetensors");
  float second = 0;  // the header's odd length leaves the data unaligned
  std::memcpy(&second, static_cast<const char*>(file.get("w").data) + 4, 4);
  EXPECT_EQ(second, -2.0f);
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
