// Megatron indexed datasets: writer/reader round trips, the exact byte layout, preprocess, and
// every malformed-file path.
#include "kiln/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/preprocess.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

StorageOptions pread_options() {  // local files read with pread instead of a memory map
  StorageOptions options;
  options.local_io = LocalIo::Pread;
  return options;
}

using testing::error_of;
using testing::TempDir;

void write_example(const std::string& prefix, IndexedDType dtype) {
  IndexedDatasetWriter writer(prefix, dtype);
  writer.add_document(std::vector<int32_t>{5, 6, 7});
  writer.add_document(std::vector<int32_t>{});
  writer.add_document(std::vector<int32_t>{9, 40000});
  writer.finish();
}

TEST(IndexedDataset, RoundTripsBothDtypesWithMegatronsLayout) {
  TempDir dir;
  for (IndexedDType dtype : {IndexedDType::UInt16, IndexedDType::Int32}) {
    const std::string prefix = dir / (dtype == IndexedDType::UInt16 ? "u16" : "i32");
    write_example(prefix, dtype);
    const IndexedDataset dataset(prefix, 50257);
    EXPECT_EQ(dataset.num_sequences(), 3);
    EXPECT_EQ(dataset.num_documents(), 3);
    EXPECT_EQ(dataset.num_tokens(), 5);
    EXPECT_EQ(dataset.document_boundaries(), (std::vector<int64_t>{0, 1, 2, 3}));
    std::vector<int32_t> tokens;
    dataset.read(2, 0, 2, tokens);
    dataset.read(0, 1, 2, tokens);
    EXPECT_EQ(tokens, (std::vector<int32_t>{9, 40000, 6, 7}));
  }
  // Header: magic, version 1, dtype code, 3 sequences, 4 document entries; then the arrays.
  const std::string idx = testing::read_file_bytes(dir / "u16.idx");
  ASSERT_EQ(idx.size(), 34u + 3 * 4 + 3 * 8 + 4 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  uint64_t version = 0, sequences = 0, documents = 0;
  std::memcpy(&version, idx.data() + 9, 8);
  std::memcpy(&sequences, idx.data() + 18, 8);
  std::memcpy(&documents, idx.data() + 26, 8);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(static_cast<int>(idx[17]), 8);
  EXPECT_EQ(sequences, 3u);
  EXPECT_EQ(documents, 4u);
  int64_t pointers[3];
  std::memcpy(pointers, idx.data() + 34 + 12, sizeof(pointers));
  EXPECT_EQ(pointers[2], 6);  // 3 uint16 tokens, then an empty sequence
  EXPECT_EQ(testing::read_file_bytes(dir / "u16.bin").size(), 10u);
  EXPECT_EQ(static_cast<int>(testing::read_file_bytes(dir / "i32.idx")[17]), 4);
}

TEST(IndexedDataset, MalformedFilesNameTheCulprit) {
  TempDir dir;
  const std::string prefix = dir / "d";
  write_example(prefix, IndexedDType::UInt16);
  const std::string idx = testing::read_file_bytes(prefix + ".idx"), bin = testing::read_file_bytes(prefix + ".bin");
  auto expect = [&](const std::string& new_idx, const std::string& new_bin, const std::string& fragment,
                    int64_t vocab = 50257) {
    testing::write_file_bytes(dir / "x.idx", new_idx);
    testing::write_file_bytes(dir / "x.bin", new_bin);
    const std::string message = error_of([&] { IndexedDataset dataset(dir / "x", vocab); });
    EXPECT_NE(message.find(fragment), std::string::npos) << "got: " << message;
  };
  expect(idx, bin.substr(0, 8), "x.idx: sequence 2 (2 tokens at byte 6) runs past the end of");
  expect(idx.substr(0, 20), bin, "truncated index");
  expect(idx.substr(0, idx.size() - 8), bin, "header declares 3 sequences and 4 document entries");
  std::string magic = idx;
  magic[0] = 'X';
  expect(magic, bin, "bad magic at offset 0");
  std::string dtype = idx;
  dtype[17] = 7;
  expect(dtype, bin, "dtype code 7 at offset 17");
  std::string boundaries = idx;  // 0, 1, 2, 3 -> 0, 1, 0, 3
  const int64_t decreasing = 0;
  std::memcpy(boundaries.data() + 34 + 12 + 24 + 16, &decreasing, 8);
  expect(boundaries, bin, "document boundary 2 decreases");
  expect(idx, bin, "token 40000 at byte offset 8 (sequence 2) is outside the vocabulary [0, 30000)", 30000);
  // Read through pread (as remote files are), the .bin is not scanned on open; the bad token is
  // named when its sequence is read, and the good ones still read.
  const Storage pread_storage(pread_options());
  const IndexedDataset unscanned(dir / "x", 30000, pread_storage);
  std::vector<int32_t> tokens;
  unscanned.read(0, 0, unscanned.sequence_length(0), tokens);
  EXPECT_EQ(tokens.size(), 3u);
  const std::string on_read = error_of([&] { unscanned.read(2, 0, unscanned.sequence_length(2), tokens); });
  EXPECT_NE(on_read.find("x.bin: token 40000 at byte offset 8 (sequence 2) is outside the vocabulary [0, 30000)"),
            std::string::npos)
      << on_read;
  EXPECT_NE(error_of([&] { IndexedDataset dataset(dir / "missing", 10); }).find("missing.bin"), std::string::npos);
}

TEST(Preprocess, JsonLinesToTheSameIdsAsTheTokenizerWithAnyWorkerCount) {
  TempDir dir;
  const std::vector<std::string> texts = {"Hello world", " The quick brown fox", "naïve café 🙂", "line\n\nbreak"};
  {
    std::ofstream jsonl(dir / "in.jsonl");
    for (const std::string& text : texts) jsonl << nlohmann::json{{"text", text}, {"id", 1}}.dump() << "\n";
  }
  PreprocessOptions options;
  options.inputs = {dir / "in.jsonl"};
  options.tokenizer_dir = KILN_DEFAULT_TOKENIZER_DIR;
  options.append_eod = true;
  options.batch_documents = 3;  // two batches
  options.output_prefix = dir / "one";
  options.workers = 1;
  const PreprocessSummary summary = preprocess(options);
  EXPECT_EQ(summary.prefix, dir / "one_text_document");
  EXPECT_EQ(summary.documents, 4);
  options.output_prefix = dir / "made/here/two";  // the prefix's folders are made
  options.workers = 2;
  preprocess(options);
  EXPECT_EQ(testing::read_file_bytes(dir / "one_text_document.bin"),
            testing::read_file_bytes(dir / "made/here/two_text_document.bin"));
  EXPECT_EQ(testing::read_file_bytes(dir / "one_text_document.idx"),
            testing::read_file_bytes(dir / "made/here/two_text_document.idx"));

  const Gpt2Tokenizer tokenizer(KILN_DEFAULT_TOKENIZER_DIR);
  const IndexedDataset dataset(dir / "one_text_document", tokenizer.vocab_size());
  ASSERT_EQ(dataset.num_documents(), 4);
  for (int64_t d = 0; d < 4; ++d) {
    std::vector<int32_t> expected = tokenizer.encode(texts[static_cast<size_t>(d)]), actual;
    expected.push_back(Gpt2Tokenizer::kEndOfText);
    dataset.read(d, 0, dataset.sequence_length(d), actual);
    EXPECT_EQ(actual, expected) << texts[static_cast<size_t>(d)];
  }
  EXPECT_EQ(summary.tokens, dataset.num_tokens());
}

TEST(Preprocess, BadInputNamesFileAndLine) {
  TempDir dir;
  PreprocessOptions options;
  options.tokenizer_dir = KILN_DEFAULT_TOKENIZER_DIR;
  options.output_prefix = dir / "out";
  std::ofstream(dir / "bad.jsonl") << "{\"text\": \"fine\"}\n{not json}\n";
  options.inputs = {dir / "bad.jsonl"};
  EXPECT_NE(error_of([&] { preprocess(options); }).find("bad.jsonl:2: not a JSON object"), std::string::npos);
  std::ofstream(dir / "key.jsonl") << "{\"body\": \"no text field\"}\n";
  options.inputs = {dir / "key.jsonl"};
  EXPECT_NE(error_of([&] { preprocess(options); }).find("key.jsonl:1: no string field 'text'"), std::string::npos);
  std::ofstream(dir / "bytes.txt", std::ios::binary) << "ok \xc3 broken";
  options.inputs = {dir / "bytes.txt"};
  options.format = "text";
  EXPECT_NE(error_of([&] { preprocess(options); }).find("bytes.txt: not valid UTF-8 at byte offset 3"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "out_text_document.idx"));  // nothing half-written
  options.format = "jsonl";
  options.inputs = {dir / "key.jsonl"};
  std::ofstream(dir / "a-file") << "x";
  options.output_prefix = dir / "a-file/out";
  EXPECT_NE(error_of([&] { preprocess(options); })
                .find("preprocess: cannot create the folder '" + dir / "a-file" + "' of --output-prefix"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
