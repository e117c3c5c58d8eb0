// Every reader of a user's files, fed thousands of corrupted copies of a valid file
// (support/corruptions.h): each copy is accepted or refused with a kiln::Error naming the file,
// never anything else. Under -DKILN_SANITIZE=address,undefined the same runs also prove that no
// corruption makes a reader read out of bounds or hit undefined behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "kiln/data/classification_csv.h"
#include "kiln/data/gpt2_tokenizer.h"
#include "kiln/data/gpt_dataset.h"
#include "kiln/data/indexed_dataset.h"
#include "kiln/data/prepare_text.h"
#include "kiln/data/preprocess.h"
#include "kiln/data/token_dataset.h"
#include "kiln/data/token_shard.h"
#include "kiln/storage/chunk_cache.h"
#include "kiln/storage/local_file.h"
#include "kiln/train/config.h"
#include "kiln/train/safetensors.h"
#include "kiln/train/trainer.h"
#include "support/corruptions.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::CorruptionOptions;
using testing::corruptions_of;
using testing::expect_rejected_by_name_or_accepted;
using testing::read_file_bytes;
using testing::TempDir;

const Storage& pread_storage() {  // local files read with pread instead of a memory map
  static const Storage storage([] {
    StorageOptions options;
    options.local_io = LocalIo::Pread;
    return options;
  }());
  return storage;
}

// Reads every byte a file's reader hands out, so a range past the mapped file is an access.
uint64_t touch(const void* data, size_t bytes) {
  const auto* begin = static_cast<const unsigned char*>(data);
  return std::accumulate(begin, begin + bytes, uint64_t{0});
}

// Both refusals and acceptances must occur, or the corruptions did not exercise the reader.
void expect_both_outcomes(const testing::CorruptionTally& tally) {
  EXPECT_GT(tally.rejected, 0);
  EXPECT_GT(tally.accepted, 0);
}

TEST(CorruptedFiles, SafetensorsFilesAreRefusedByName) {
  TempDir dir;
  const std::vector<float> weights(24, 0.5f);
  const std::vector<uint16_t> halves(10, 0x3f80);
  const std::vector<int32_t> counts{1, 2, 3};
  const std::string path = dir / "model.safetensors";
  write_safetensors(path,
                    {{"w", DType::F32, Shape{4, 6}, weights.data()},
                     {"h", DType::BF16, Shape{10}, halves.data()},
                     {"n", DType::I32, Shape{3}, counts.data()}},
                    {{"format", "pt"}});
  CorruptionOptions options;
  options.header_bytes = 96;
  options.text = false;
  auto tally = expect_rejected_by_name_or_accepted(path, corruptions_of(read_file_bytes(path), options),
                                                   "model.safetensors", [&] {
                                                     const SafetensorsFile file(path);
                                                     for (const auto& [name, entry] : file.entries())
                                                       touch(entry.data, static_cast<size_t>(entry.shape.numel()) *
                                                                             dtype_size(entry.dtype));
                                                   });
  expect_both_outcomes(tally);
  options.text = true;  // the JSON header, edited as text
  tally = expect_rejected_by_name_or_accepted(path, corruptions_of(read_file_bytes(path), options),
                                              "model.safetensors", [&] { SafetensorsFile file(path); });
  expect_both_outcomes(tally);
}

// A safetensors file with `header` as its JSON header and `data_bytes` zero bytes of data.
void write_crafted_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  const uint64_t length = header.size();
  std::string bytes(reinterpret_cast<const char*>(&length), sizeof(length));
  testing::write_file_bytes(path, bytes + header + std::string(data_bytes, '\0'));
}

TEST(CorruptedFiles, SafetensorsShapesWhoseSizeOverflowsAreRefused) {
  TempDir dir;
  const std::string path = dir / "crafted.safetensors";
  // 2^62 fp32 elements are 2^64 bytes: zero, when counted in 64 bits.
  write_crafted_safetensors(path, R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(testing::error_of([&] { SafetensorsFile file(path); }).find("crafted.safetensors: tensor 'w' has shape"),
            std::string::npos);
  // 2^32 x 2^32 elements overflow a 64-bit count.
  write_crafted_safetensors(path, R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                            0);
  EXPECT_NE(testing::error_of([&] { SafetensorsFile file(path); }).find("crafted.safetensors: tensor 'w' has shape"),
            std::string::npos);
  // A dimension past int64's range, and a fractional one.
  write_crafted_safetensors(path, R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(testing::error_of([&] { SafetensorsFile file(path); }).find("crafted.safetensors: tensor 'w'"),
            std::string::npos);
  write_crafted_safetensors(path, R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(testing::error_of([&] { SafetensorsFile file(path); }).find("crafted.safetensors: tensor 'w'"),
            std::string::npos);
  // A shape of zeros with an empty range is a valid empty tensor.
  write_crafted_safetensors(path, R"({"w":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(testing::error_of([&] { SafetensorsFile file(path); }), "");
}

void write_indexed_example(const std::string& prefix, IndexedDType dtype) {
  IndexedDatasetWriter writer(prefix, dtype);
  writer.add_document(std::vector<int32_t>{5, 6, 7, 8});
  writer.add_document(std::vector<int32_t>{});
  writer.add_document(std::vector<int32_t>{9, 999, 3});
  writer.add_document(std::vector<int32_t>{1});
  writer.finish();
}

void read_every_sequence(const std::string& prefix, const Storage& storage) {
  const IndexedDataset data(prefix, 1000, storage);
  std::vector<int32_t> tokens;
  for (int64_t s = 0; s < data.num_sequences(); ++s) data.read(s, 0, data.sequence_length(s), tokens);
}

TEST(CorruptedFiles, IndexedDatasetsAreRefusedByName) {
  for (IndexedDType dtype : {IndexedDType::UInt16, IndexedDType::Int32}) {
    TempDir dir;
    const std::string prefix = dir / "corpus";
    write_indexed_example(prefix, dtype);
    CorruptionOptions options;
    options.header_bytes = 128;  // the whole index: header, lengths, offsets, boundaries
    for (const Storage* storage : {&Storage::defaults(), &pread_storage()}) {
      // A damaged index may point a sequence at the wrong bytes: the data file's refusal of them
      // names both files' prefix.
      expect_both_outcomes(expect_rejected_by_name_or_accepted(
          prefix + ".idx", corruptions_of(read_file_bytes(prefix + ".idx"), options), "corpus.",
          [&] { read_every_sequence(prefix, *storage); }));
      expect_both_outcomes(expect_rejected_by_name_or_accepted(
          prefix + ".bin", corruptions_of(read_file_bytes(prefix + ".bin"), options), "corpus.bin",
          [&] { read_every_sequence(prefix, *storage); }));
    }
  }
}

// All samples of a GptDataset over corpus documents [0, 4), built or read from its index cache.
std::vector<int32_t> all_samples(const std::string& prefix) {
  const GptDataset dataset(std::make_shared<const IndexedDataset>(prefix, 1000), prefix, {0, 4}, 3, 7, 11);
  std::vector<int32_t> tokens(3), targets(3), all;
  for (int64_t i = 0; i < dataset.num_samples(); ++i) {
    dataset.sample(i, tokens, targets);
    all.insert(all.end(), tokens.begin(), tokens.end());
    all.insert(all.end(), targets.begin(), targets.end());
  }
  return all;
}

TEST(CorruptedFiles, DamagedIndexCachesAreRebuilt) {
  TempDir dir;
  const std::string prefix = dir / "corpus";
  write_indexed_example(prefix, IndexedDType::UInt16);
  const std::vector<int32_t> expected = all_samples(prefix);
  std::vector<std::string> caches;
  for (const auto& entry : std::filesystem::directory_iterator(prefix + "_kiln_cache"))
    caches.push_back(entry.path().string());
  ASSERT_EQ(caches.size(), 2u);  // the document order and the shuffle
  for (const std::string& cache : caches) {
    CorruptionOptions options;
    options.header_bytes = 80;
    const auto tally = expect_rejected_by_name_or_accepted(cache, corruptions_of(read_file_bytes(cache), options), "",
                                                           [&] { EXPECT_EQ(all_samples(prefix), expected); });
    EXPECT_EQ(tally.rejected, 0);
  }
}

// A chunk file of the data cache (S3 data behind --cache-dir, storage/chunk_cache.h) damaged on
// disk is never served: after every corruption of one, a fresh reader returns the object's own
// bytes, fetches that chunk again exactly when the file's bytes changed, and rewrites it whole.
TEST(CorruptedFiles, DamagedDataCacheChunksAreFetchedAgain) {
  TempDir dir;
  constexpr uint64_t kChunk = 4096;
  Rng rng(7);
  std::string object(3 * kChunk + 100, '\0');  // four chunks, the last one short
  for (char& c : object) c = static_cast<char>(rng.below(256));
  testing::write_file_bytes(dir / "remote.bin", object);
  const auto read_all = [&] {  // a new reader each time, as a new process would make
    const ChunkCachedFile file(open_pread_file(dir / "remote.bin"), dir / "cache", "remote.bin v1", kChunk);
    std::vector<uint8_t> all(object.size());
    file.read(0, all);
    EXPECT_EQ(std::string(all.begin(), all.end()), object);
    return std::pair{file.stats(), file.folder()};
  };
  const auto [filled, folder] = read_all();
  ASSERT_EQ(filled.chunks_fetched, 4u);
  const std::string chunk_file = folder + "/chunk-00000001";
  const std::string valid = read_file_bytes(chunk_file);
  ASSERT_EQ(valid.size(), kChunk + 8);  // the chunk, then its hash
  CorruptionOptions options;
  options.header_bytes = 16;
  int damaged = 0;
  const auto tally = expect_rejected_by_name_or_accepted(chunk_file, corruptions_of(valid, options), "", [&] {
    const bool changed = read_file_bytes(chunk_file) != valid;
    const ChunkCacheStats stats = read_all().first;
    EXPECT_EQ(stats.chunks_fetched, changed ? 1u : 0u);
    EXPECT_EQ(read_file_bytes(chunk_file), valid);
    damaged += static_cast<int>(stats.damaged_chunks);
  });
  EXPECT_EQ(tally.rejected, 0);
  EXPECT_GT(damaged, 0);  // some corruptions kept the size: their hash found them
  // A file of the older layout (the chunk without its hash) has the wrong size: fetched again.
  testing::write_file_bytes(chunk_file, object.substr(kChunk, kChunk));
  EXPECT_EQ(read_all().first.chunks_fetched, 1u);
}

TEST(CorruptedFiles, TokenShardsAndTheirMetadataAreRefusedByName) {
  TempDir dir;
  std::vector<uint16_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7 % 50);
  const std::string shard = dir / "train_000000.bin";
  write_token_shard(shard, tokens);
  CorruptionOptions options;
  options.header_bytes = 40;  // magic, version, token count and the first reserved words
  for (const Storage* storage : {&Storage::defaults(), &pread_storage()})
    expect_both_outcomes(expect_rejected_by_name_or_accepted(
        shard, corruptions_of(read_file_bytes(shard), options), "train_000000.bin", [&] {
          const TokenShard opened(shard, 50, *storage);
          std::vector<int32_t> all(static_cast<size_t>(opened.size()));
          opened.read(0, all);
        }));
  testing::write_file_bytes(dir / "meta.json", R"({"vocab_size": 50, "tokenizer": "toy"})");
  options.text = true;
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      dir / "meta.json", corruptions_of(read_file_bytes(dir / "meta.json"), options), "meta.json", [&] {
        const std::optional<int64_t> vocab = read_data_vocab_size(dir.path());
        TokenDataset dataset(dir.path(), "train", vocab.value_or(50), 16, 1);
      }));
}

TEST(CorruptedFiles, ClassificationCsvFilesAndMetadataAreRefusedByName) {
  TempDir dir;
  ClassificationSynthOptions synth;
  synth.output_dir = dir.path();
  synth.files = 2;
  synth.min_rows = 6;
  synth.max_rows = 8;
  synth.seq_length = 6;
  synth.vocab_size = 500;
  synth.num_labels = 3;
  write_synthetic_classification(synth);
  CorruptionOptions options;
  options.text = true;
  options.header_bytes = 48;
  const auto read_all_rows = [&] {
    const ClassificationDataset dataset(dir.path());
    for (int64_t i = 0; i < dataset.size(); ++i) dataset.sample(i);
  };
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      dir / "part-00000.csv", corruptions_of(read_file_bytes(dir / "part-00000.csv"), options), "part-00000.csv",
      read_all_rows));
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      dir / "metadata.json", corruptions_of(read_file_bytes(dir / "metadata.json"), options), "metadata.json",
      read_all_rows));
}

// A GPT-2 tokenizer cut down to its 256 byte tokens and first 44 merges (ids below 300), written
// to `dir`: small enough to read thousands of times.
void write_small_tokenizer(const std::string& dir) {
  const nlohmann::json full = nlohmann::json::parse(read_file_bytes(std::string(KILN_DEFAULT_TOKENIZER_DIR) + "/encoder.json"));
  nlohmann::json small = nlohmann::json::object();
  for (const auto& [token, id] : full.items())
    if (id.get<int64_t>() < 300) small[token] = id;
  testing::write_file_bytes(dir + "/encoder.json", small.dump());
  const std::string merges = read_file_bytes(std::string(KILN_DEFAULT_TOKENIZER_DIR) + "/vocab.bpe");
  size_t end = 0;
  for (int line = 0; line < 45; ++line) end = merges.find('\n', end) + 1;  // the version line and 44 merges
  testing::write_file_bytes(dir + "/vocab.bpe", merges.substr(0, end));
}

TEST(CorruptedFiles, TokenizerFilesAreRefusedByName) {
  TempDir dir;
  write_small_tokenizer(dir.path());
  const auto encode_and_decode = [&] {
    const Gpt2Tokenizer tokenizer(dir.path());
    tokenizer.decode(tokenizer.encode("The three then in the inn, tea at ten."));
  };
  ASSERT_EQ(testing::error_of(encode_and_decode), "");
  CorruptionOptions options;
  options.text = true;
  options.random_edits = 300;
  for (const char* name : {"encoder.json", "vocab.bpe"})
    expect_both_outcomes(expect_rejected_by_name_or_accepted(
        dir / name, corruptions_of(read_file_bytes(dir / name), options), name, encode_and_decode));
  // Ids must be distinct: two tokens on one id leave another id without a token.
  nlohmann::json encoder = nlohmann::json::parse(read_file_bytes(dir / "encoder.json"));
  encoder["the"] = encoder["in"];
  testing::write_file_bytes(dir / "encoder.json", encoder.dump());
  EXPECT_NE(testing::error_of(encode_and_decode).find("encoder.json: tokens '"), std::string::npos);
}

TEST(CorruptedFiles, PreprocessInputsAreRefusedByName) {
  TempDir dir;
  write_small_tokenizer(dir.path());
  const std::string input = dir / "docs.jsonl";
  testing::write_file_bytes(input,
                            "{\"text\": \"The three then in the inn.\", \"id\": 1}\n"
                            "{\"text\": \"tea at ten \\u00e9\\n\", \"id\": 2}\n{\"text\": \"\"}\n");
  PreprocessOptions options;
  options.inputs = {input};
  options.output_prefix = dir / "out";
  options.tokenizer_dir = dir.path();
  options.append_eod = false;
  options.workers = 2;
  CorruptionOptions corruptions;
  corruptions.text = true;
  corruptions.random_edits = 300;
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      input, corruptions_of(read_file_bytes(input), corruptions), "docs.jsonl", [&] {
        const PreprocessSummary summary = preprocess(options);
        read_every_sequence(summary.prefix, Storage::defaults());  // what was written reads back
      }));
  // Plain text files, one document each, into byte-level shards.
  const std::string text = dir / "book.txt";
  testing::write_file_bytes(text, "Caf\xc3\xa9 au lait, \xe2\x82\xac 3.\nA second line.\n");
  PrepareTextOptions prepare;
  prepare.inputs = {text};
  prepare.output_dir = dir / "shards";
  prepare.val_fraction = 0;
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      text, corruptions_of(read_file_bytes(text), corruptions), "book.txt", [&] {
        std::filesystem::remove_all(prepare.output_dir);
        const PrepareTextSummary summary = prepare_text(prepare);
        for (const std::string& shard : summary.shards) {
          const TokenShard opened(shard, kByteVocabSize);
          std::vector<int32_t> all(static_cast<size_t>(opened.size()));
          opened.read(0, all);
        }
      }));
}

TEST(CorruptedFiles, YamlConfigsAreRefusedByName) {
  TempDir dir;
  const std::string path = dir / "run.yaml";
  testing::write_file_bytes(path,
                            "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\n"
                            "micro_batch_size: 4\nglobal_batch_size: 8\nlr: 0.0006\nlr_decay_style: cosine\n"
                            "bf16: true\nsplit: \"949,50,1\"\nrecompute_granularity: selective\n");
  CorruptionOptions options;
  options.text = true;
  options.random_edits = 400;
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      path, corruptions_of(read_file_bytes(path), options), "run.yaml", [&] {
        Config config;
        apply_yaml_file(config, path);
        try {  // a parsed value may still be inconsistent: that refusal names the key, not the file
          config.resolve();
          config.validate();
        } catch (const Error&) {
        }
      }));
}

TEST(CorruptedFiles, CheckpointsAreRefusedByName) {
  TempDir dir;
  testing::write_toy_dataset(dir.path(), 29, 4000, 400);
  Config config;
  config.data_path = dir.path();
  config.num_layers = 1;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.seq_length = 8;
  config.micro_batch_size = 2;
  config.train_iters = 1;
  config.lr_warmup_iters = 0;
  config.eval_iters = 0;
  config.save = dir / "ckpt";
  Trainer(config).run();
  config.load = config.save;
  config.train_iters = 2;
  const std::string folder = dir / "ckpt/iter_0000001";
  const auto resume = [&] { Trainer trainer(config); };
  CorruptionOptions binary;
  binary.header_bytes = 32;
  binary.random_edits = 60;
  CorruptionOptions text = binary;
  text.text = true;
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string path = folder + "/" + name;
    expect_both_outcomes(expect_rejected_by_name_or_accepted(path, corruptions_of(read_file_bytes(path), binary),
                                                             name, resume));
    expect_both_outcomes(expect_rejected_by_name_or_accepted(path, corruptions_of(read_file_bytes(path), text),
                                                             name, resume));
  }
  text.random_edits = 300;
  expect_both_outcomes(expect_rejected_by_name_or_accepted(
      folder + "/trainer_state.json", corruptions_of(read_file_bytes(folder + "/trainer_state.json"), text),
      "trainer_state.json", resume));
  const std::string tracker = dir / "ckpt/latest_checkpointed_iteration.txt";
  expect_both_outcomes(expect_rejected_by_name_or_accepted(tracker, corruptions_of(read_file_bytes(tracker), text),
                                                           "latest_checkpointed_iteration.txt", resume));

  // Values that parse but cannot be a saved state.
  const std::string state_path = folder + "/trainer_state.json";
  const std::string state = read_file_bytes(state_path);
  const auto refusal_with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json edited = nlohmann::json::parse(state);
    if (std::string(field) == "scale") edited["loss_scaler"]["scale"] = value;
    else edited[field] = value;
    testing::write_file_bytes(state_path, edited.dump());
    const std::string error = testing::error_of(resume);
    testing::write_file_bytes(state_path, state);
    return error;
  };
  EXPECT_NE(refusal_with("consumed_samples", 1.5).find("trainer_state.json: 'consumed_samples' is 1.5, not a whole"),
            std::string::npos);
  EXPECT_NE(refusal_with("iteration", -3).find("'iteration' is -3"), std::string::npos);
  EXPECT_NE(refusal_with("optimizer_steps", 1e30).find("'optimizer_steps' is 1e+30"), std::string::npos);
  EXPECT_NE(refusal_with("scale", -1.0).find("(loss_scaler): 'scale' is -1.0, not a positive fp32 number"),
            std::string::npos);
  EXPECT_NE(refusal_with("scale", 1e300).find("'scale' is 1e+300"), std::string::npos);
  EXPECT_NE(refusal_with("distributed", {{"world_size", 4}, {"optimizer_layout", "per-rank"}})
                .find("trainer_state.json (distributed): 'optimizer_layout' is \"per-rank\": this kiln reads only "
                      "'gathered' optimizer files"),
            std::string::npos);
  EXPECT_NE(refusal_with("distributed", {{"world_size", 0}, {"optimizer_layout", "gathered"}}).find("'world_size' is 0"),
            std::string::npos);
  EXPECT_NE(refusal_with("distributed", 7).find("trainer_state.json: 'distributed' is 7, not an object"),
            std::string::npos);
  testing::write_file_bytes(tracker, "1abc");
  EXPECT_NE(testing::error_of(resume).find("expected an iteration number, got '1abc'"), std::string::npos);
  testing::write_file_bytes(tracker, "1\n");
  EXPECT_EQ(testing::error_of(resume), "");

  // Tensors whose values no training run keeps.
  const auto rewritten_with = [&](const char* file_name, const std::string& tensor, float value) {
    const std::string path = folder + "/" + file_name;
    const std::string valid = read_file_bytes(path);
    {
      const SafetensorsFile file(path);
      std::vector<std::vector<float>> copies;
      std::vector<SafetensorsEntry> entries;
      for (const auto& [name, entry] : file.entries()) {
        const auto* data = static_cast<const float*>(entry.data);
        copies.emplace_back(data, data + entry.shape.numel());
        if (name == tensor) copies.back()[1] = value;
        entries.push_back({name, entry.dtype, entry.shape, copies.back().data()});
      }
      write_safetensors(path + ".edited", entries);
    }
    std::filesystem::rename(path + ".edited", path);
    const std::string error = testing::error_of(resume);
    testing::write_file_bytes(path, valid);
    return error;
  };
  EXPECT_NE(rewritten_with("model.safetensors", "h.0.mlp.c_fc.weight", std::nanf(""))
                .find("model.safetensors: tensor 'h.0.mlp.c_fc.weight' holds nan at element 1"),
            std::string::npos);
  EXPECT_NE(rewritten_with("optimizer.safetensors", "exp_avg.wpe.weight", -INFINITY)
                .find("optimizer.safetensors: tensor 'exp_avg.wpe.weight' holds -inf at element 1"),
            std::string::npos);
  EXPECT_NE(rewritten_with("optimizer.safetensors", "exp_avg_sq.ln_f.bias", -0.25f)
                .find("optimizer.safetensors: a second moment 'exp_avg_sq.*' is negative (-0.25"),
            std::string::npos);
  EXPECT_EQ(testing::error_of(resume), "");
}

}  // namespace
}  // namespace kiln
