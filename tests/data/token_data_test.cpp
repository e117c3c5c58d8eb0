// Token shards, prepare-text and the random-window dataset, including every bad-input path.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kiln/core/error.h"
#include "kiln/data/loader.h"
#include "kiln/data/prepare_text.h"
#include "kiln/data/token_dataset.h"
#include "kiln/data/token_shard.h"
#include "support/temp_dir.h"
#include "support/error_of.h"

namespace kiln {
namespace {

StorageOptions pread_options() {  // local files read with pread instead of a memory map
  StorageOptions options;
  options.local_io = LocalIo::Pread;
  return options;
}

using testing::error_of;

using testing::TempDir;


void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), {}};
}

TEST(TokenShard, RoundTripsInLlmcFormat) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {1, 2, 256, 7};
  write_token_shard(dir / "a.bin", tokens);
  const std::vector<char> bytes = read_bytes(dir / "a.bin");
  ASSERT_EQ(bytes.size(), 1024u + 8u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  TokenShard shard(dir / "a.bin", 257);
  ASSERT_EQ(shard.size(), 4);
  std::vector<int32_t> read(3);
  shard.read(1, read);
  EXPECT_EQ(read, (std::vector<int32_t>{2, 256, 7}));
  const Storage pread_storage(pread_options());
  TokenShard through_pread(dir / "a.bin", 257, pread_storage);
  std::fill(read.begin(), read.end(), 0);
  through_pread.read(1, read);
  EXPECT_EQ(read, (std::vector<int32_t>{2, 256, 7}));
  EXPECT_NE(error_of([&] { through_pread.read(2, read); }).find("outside the shard's 4"), std::string::npos);
}

TEST(TokenShard, BadInputNamesFileAndOffset) {
  TempDir dir;
  write_token_shard(dir / "good.bin", std::vector<uint16_t>{1, 2, 3, 4});
  std::vector<char> bytes = read_bytes(dir / "good.bin");

  write_bytes(dir / "short.bin", std::vector<char>(bytes.begin(), bytes.begin() + 100));
  EXPECT_NE(error_of([&] { TokenShard(dir / "short.bin", 257); }).find("short.bin: truncated shard"), std::string::npos);

  write_bytes(dir / "cut.bin", std::vector<char>(bytes.begin(), bytes.end() - 2));
  EXPECT_NE(error_of([&] { TokenShard(dir / "cut.bin", 257); }).find("declares 4 tokens"), std::string::npos);

  std::vector<char> magic = bytes;
  magic[0] = 1;
  write_bytes(dir / "magic.bin", magic);
  EXPECT_NE(error_of([&] { TokenShard(dir / "magic.bin", 257); }).find("bad magic"), std::string::npos);

  std::vector<char> version = bytes;
  version[4] = 9;
  write_bytes(dir / "version.bin", version);
  EXPECT_NE(error_of([&] { TokenShard(dir / "version.bin", 257); }).find("version 9"), std::string::npos);

  write_token_shard(dir / "vocab.bin", std::vector<uint16_t>{1, 300, 2});
  const std::string message = error_of([&] { TokenShard(dir / "vocab.bin", 257); });
  EXPECT_NE(message.find("token 300 at byte offset 1026"), std::string::npos) << message;
  // Read through pread (as remote files are), the same token fails when it is read.
  const Storage pread_storage(pread_options());
  TokenShard unchecked(dir / "vocab.bin", 257, pread_storage);
  std::vector<int32_t> window(3);
  const std::string on_read = error_of([&] { unchecked.read(0, window); });
  EXPECT_NE(on_read.find("vocab.bin: token 300 at byte offset 1026"), std::string::npos) << on_read;

  EXPECT_NE(error_of([&] { TokenShard(dir / "missing.bin", 257); }).find("missing.bin"), std::string::npos);
}

TEST(PrepareText, SplitsWholeDocumentsAndWritesMeta) {
  TempDir dir;
  std::filesystem::create_directories(dir / "in");
  for (int i = 0; i < 10; ++i)
    std::ofstream(dir / ("in/doc" + std::to_string(i) + ".txt")) << std::string(100, static_cast<char>('a' + i));
  PrepareTextOptions options;
  options.inputs = {dir / "in"};
  options.output_dir = dir / "out";
  options.val_fraction = 0.2;
  const PrepareTextSummary summary = prepare_text(options);
  EXPECT_EQ(summary.documents, 10);
  EXPECT_EQ(summary.val_documents, 2);
  EXPECT_EQ(summary.train_tokens + summary.val_tokens, 10 * 101);
  TokenShard val(dir / "out/val_000000.bin", kByteVocabSize);
  EXPECT_EQ(val.size(), 2 * 101);
  std::vector<int32_t> token(1);
  val.read(100, token);
  EXPECT_EQ(token[0], kByteEndOfDocument);
  EXPECT_EQ(read_data_vocab_size(dir / "out"), kByteVocabSize);
  // The same seed gives the same split.
  options.output_dir = dir / "again";
  EXPECT_EQ(prepare_text(options).val_tokens, summary.val_tokens);
  EXPECT_EQ(read_bytes(dir / "again/val_000000.bin"), read_bytes(dir / "out/val_000000.bin"));
}

TEST(PrepareText, OneDocumentIsSplitByPositionAtALineBreak) {
  // nanoGPT's first run: one input.txt. Its end becomes the validation text.
  TempDir dir;
  std::string text;
  for (int line = 0; line < 100; ++line) text += fmt::format("line {:03d}\n", line);  // 9 bytes a line
  std::ofstream(dir / "input.txt") << text;
  PrepareTextOptions options;
  options.inputs = {dir / "input.txt"};
  options.output_dir = dir / "out";
  options.val_fraction = 0.1;
  const PrepareTextSummary summary = prepare_text(options);
  EXPECT_TRUE(summary.split_by_position);
  EXPECT_EQ(summary.documents, 1);
  // 90 bytes from the end falls on a line start: the last 10 lines, each part with its end id.
  EXPECT_EQ(summary.val_tokens, 90 + 1);
  EXPECT_EQ(summary.train_tokens, 810 + 1);
  TokenShard val(dir / "out/val_000000.bin", kByteVocabSize), train(dir / "out/train_000000.bin", kByteVocabSize);
  std::vector<int32_t> first(8), last(1);
  val.read(0, first);
  EXPECT_EQ(std::string(first.begin(), first.end()), "line 090");
  train.read(train.size() - 1, last);
  EXPECT_EQ(last[0], kByteEndOfDocument);

  // No line break in reach: the cut moves to the start of a UTF-8 character.
  std::string accents = "x";  // then é (2 bytes) 101 times: 203 bytes, 19 of them at 9.5% from the end
  for (int i = 0; i < 101; ++i) accents += "\xc3\xa9";
  std::ofstream(dir / "accents.txt", std::ios::binary) << accents;
  options.inputs = {dir / "accents.txt"};
  options.output_dir = dir / "accents";
  options.val_fraction = 0.095;  // a cut at byte 184, inside a character: moved back to 183
  const PrepareTextSummary split = prepare_text(options);
  EXPECT_TRUE(split.split_by_position);
  TokenShard accented(dir / "accents/val_000000.bin", kByteVocabSize);
  std::vector<int32_t> lead(1);
  accented.read(0, lead);
  EXPECT_EQ(lead[0], 0xc3);
  EXPECT_EQ(split.val_tokens, 20 + 1);
  EXPECT_EQ(split.train_tokens + split.val_tokens, 203 + 2);

  // Without a validation fraction nothing is split.
  options.val_fraction = 0.0;
  options.output_dir = dir / "none";
  EXPECT_FALSE(prepare_text(options).split_by_position);
}

TEST(PrepareText, ShardsBySize) {
  TempDir dir;
  std::ofstream(dir / "a.txt") << std::string(250, 'x');
  PrepareTextOptions options;
  options.inputs = {dir / "a.txt"};
  options.output_dir = dir / "out";
  options.val_fraction = 0.0;
  options.shard_tokens = 100;
  EXPECT_EQ(prepare_text(options).shards.size(), 3u);
}

TEST(PrepareText, RejectsInvalidUtf8WithOffset) {
  TempDir dir;
  std::ofstream(dir / "bad.txt", std::ios::binary) << "hello \xff world";
  PrepareTextOptions options;
  options.inputs = {dir / "bad.txt"};
  options.output_dir = dir / "out";
  const std::string message = error_of([&] { prepare_text(options); });
  EXPECT_NE(message.find("bad.txt' is not valid UTF-8 at byte offset 6"), std::string::npos) << message;
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), -1);
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0);        // overlong
  EXPECT_EQ(find_invalid_utf8("ab\xed\xa0\x80"), 2);  // surrogate
  EXPECT_EQ(find_invalid_utf8("abc\xe2\x82"), 3);     // truncated sequence
}

TEST(TokenDataset, WindowsAreReproducibleAndShifted) {
  TempDir dir;
  std::vector<uint16_t> tokens(500);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 200);
  write_token_shard(dir / "train_000000.bin", tokens);
  write_token_shard(dir / "train_000001.bin", std::vector<uint16_t>(5, 1));  // too short: no window
  TokenDataset a(dir.path(), "train", 257, 16, 42), b(dir.path(), "train", 257, 16, 42);
  EXPECT_EQ(a.num_windows(), 500 - 16);
  std::vector<int32_t> x1, y1, x2, y2;
  DataLoader(a, 4, {0, 1, 0}).next(10, x1, y1);
  DataLoader(b, 4, {0, 1, 0}).next(10, x2, y2);
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(y1, y2);
  for (size_t i = 0; i < x1.size(); ++i) EXPECT_EQ(y1[i], (x1[i] + 1) % 200);  // next-token targets
  TokenDataset other(dir.path(), "train", 257, 16, 43);
  DataLoader(other, 4, {0, 1, 0}).next(10, x2, y2);
  EXPECT_NE(x1, x2);
}

TEST(TokenDataset, ClearErrorsForMissingData) {
  TempDir dir;
  EXPECT_NE(error_of([&] { TokenDataset(dir.path(), "train", 257, 8, 1); }).find("has no train shards"),
            std::string::npos);
  write_token_shard(dir / "train_000000.bin", std::vector<uint16_t>(5, 1));
  EXPECT_NE(error_of([&] { TokenDataset(dir.path(), "train", 257, 8, 1); }).find("no train shard holds 9 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TokenDataset(dir / "nope", "train", 257, 8, 1); }).find("is not a folder"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
