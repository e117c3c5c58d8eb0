// Every dataset format reads the same samples from S3 (s3rver on 127.0.0.1) as from the local
// copy, with and without a cache directory: Megatron indexed data, llm.c shards, classification CSV.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "kiln/data/classification_csv.h"
#include "kiln/data/gpt_dataset.h"
#include "kiln/data/token_dataset.h"
#include "support/error_of.h"
#include "support/s3rver.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

class S3Datasets : public testing::S3rverTest {
 protected:
  StorageOptions options(const std::string& cache_dir = "") const { return storage_options(cache_dir, 4096); }
  // Uploads every file of a local folder under s3://kiln-test/<prefix>/ and returns that URI.
  std::string upload(const std::string& dir, const std::string& prefix) const {
    const S3Client client(server_->settings());
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string bytes = Storage::defaults().read_all(entry.path().string());
      client.put({testing::S3rver::kBucket, prefix + "/" + entry.path().filename().string()}, bytes);
    }
    return std::string("s3://") + testing::S3rver::kBucket + "/" + prefix;
  }
};

// Samples [0, count) read in batches of `batch` (TokenSource::samples), in samples_of's layout.
std::vector<int32_t> batched_samples_of(const TokenSource& source, int64_t count, int64_t batch) {
  const auto seq = static_cast<size_t>(source.seq_length());
  std::vector<int32_t> all;
  for (int64_t first = 0; first < count; first += batch) {
    std::vector<int64_t> indices;
    for (int64_t i = first; i < std::min(count, first + batch); ++i) indices.push_back(i);
    std::vector<int32_t> tokens(indices.size() * seq), targets(tokens.size());
    source.samples(indices, tokens, targets);
    for (size_t row = 0; row < indices.size(); ++row) {
      all.insert(all.end(), tokens.begin() + static_cast<std::ptrdiff_t>(row * seq),
                 tokens.begin() + static_cast<std::ptrdiff_t>((row + 1) * seq));
      all.push_back(-1);
      all.insert(all.end(), targets.begin() + static_cast<std::ptrdiff_t>(row * seq),
                 targets.begin() + static_cast<std::ptrdiff_t>((row + 1) * seq));
    }
  }
  return all;
}

std::vector<int32_t> samples_of(const TokenSource& source, int64_t count) {
  std::vector<int32_t> all, tokens(static_cast<size_t>(source.seq_length())), targets(tokens.size());
  for (int64_t i = 0; i < count; ++i) {
    source.sample(i, tokens, targets);
    all.insert(all.end(), tokens.begin(), tokens.end());
    all.push_back(-1);
    all.insert(all.end(), targets.begin(), targets.end());
  }
  return all;
}

TEST_F(S3Datasets, IndexedDataMatchesTheLocalCopyAndCachesItsIndices) {
  TempDir local, cache;
  IndexedDatasetWriter writer(local / "corpus", IndexedDType::UInt16);
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> tokens;
    for (int t = 0; t < 20 + d % 9; ++t) tokens.push_back((d * 37 + t * 11) % 1000);
    writer.add_document(tokens);
  }
  writer.finish();
  std::filesystem::create_directories(local / "upload");
  std::filesystem::copy_file(local / "corpus.bin", local / "upload/corpus.bin");
  std::filesystem::copy_file(local / "corpus.idx", local / "upload/corpus.idx");
  const std::string remote = upload(local / "upload", "indexed") + "/corpus";

  const auto expected = samples_of(*make_gpt_data(local / "corpus", "9,1,0", DataSplit::Train, 1000, 16, 50, 7), 50);
  const Storage uncached(options());
  EXPECT_TRUE(is_indexed_data_path(remote, uncached));
  EXPECT_EQ(samples_of(*make_gpt_data(remote, "9,1,0", DataSplit::Train, 1000, 16, 50, 7, uncached), 50), expected);
  // A batch's ranges go out together (one read_many of the .bin): the same samples.
  EXPECT_EQ(batched_samples_of(*make_gpt_data(remote, "9,1,0", DataSplit::Train, 1000, 16, 50, 7, uncached), 50, 8),
            expected);
  const Storage cached(options(cache.path()));
  EXPECT_EQ(samples_of(*make_gpt_data(remote, "9,1,0", DataSplit::Train, 1000, 16, 50, 7, cached), 50), expected);
  EXPECT_TRUE(std::filesystem::exists(cache / "derived")) << "index caches of S3 data live under cache_dir";
  EXPECT_TRUE(std::filesystem::exists(cache / "objects"));
  // A blend of the remote and the local copy reads both.
  const std::string blend = "0.5 " + remote + " 0.5 " + local / "corpus";
  EXPECT_EQ(samples_of(*make_gpt_data(blend, "9,1,0", DataSplit::Train, 1000, 16, 20, 7, cached), 20).size(),
            20u * 33u);
}

TEST_F(S3Datasets, TokenShardsMatchTheLocalCopy) {
  TempDir local, cache;
  testing::write_toy_dataset(local.path(), 300, 5000, 1000);
  const std::string remote = upload(local.path(), "shards");
  const Storage storage(options(cache.path()));
  EXPECT_EQ(read_data_vocab_size(remote, storage), 300);
  const TokenDataset local_data(local.path(), "train", 300, 32, 9);
  const TokenDataset remote_data(remote, "train", 300, 32, 9, storage);
  EXPECT_EQ(remote_data.num_tokens(), local_data.num_tokens());
  EXPECT_EQ(samples_of(remote_data, 40), samples_of(local_data, 40));
  const std::string message = error_of([&] { TokenDataset(remote, "test", 300, 32, 9, storage); });
  EXPECT_NE(message.find("has no test shards"), std::string::npos) << message;
}

TEST_F(S3Datasets, ClassificationCsvMatchesTheLocalCopy) {
  TempDir local;
  ClassificationSynthOptions synth;
  synth.output_dir = local.path();
  synth.files = 3;
  synth.min_rows = 100;
  synth.max_rows = 150;
  synth.seq_length = 12;
  synth.vocab_size = 500;
  write_synthetic_classification(synth);
  const std::string remote = upload(local.path(), "csv");
  const ClassificationDataset local_data(local.path());
  const ClassificationDataset remote_data(remote, Storage(options()));
  ASSERT_EQ(remote_data.size(), local_data.size());
  for (int64_t i = 0; i < local_data.size(); i += 17) {
    const ClassificationSample a = local_data.sample(i), b = remote_data.sample(i);
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(a.attention_mask, b.attention_mask);
    EXPECT_EQ(a.label, b.label);
  }
  const std::string message = error_of([&] { ClassificationDataset(remote + "-missing", Storage(options())); });
  EXPECT_NE(message.find("metadata.json"), std::string::npos) << message;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// `kiln train --data-path s3://...` as a user runs it: credentials and endpoint from the standard
// environment variables, the cache folder filled on the first run and enough for a second.
TEST_F(S3Datasets, KilnTrainsFromS3WithTheCacheDirectory) {
  TempDir local, cache, run;
  testing::write_toy_dataset(local.path(), 61, 6000, 1000);
  const std::string remote = upload(local.path(), "train-data");
  const std::string binary = std::getenv("KILN_BINARY") ? std::getenv("KILN_BINARY") : KILN_BINARY;
  const std::string environment = "AWS_ENDPOINT_URL=" + server_->endpoint() +
                                  " AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=kiln-secret-never-printed AWS_REGION=us-east-1 ";
  const std::string command = environment + binary + " train --data-path " + remote + " --cache-dir " + cache.path() +
                              " --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
                              " --micro-batch-size 2 --train-iters 3 --eval-iters 1 --log-interval 1 2>&1";
  const auto run_command = [&](const std::string& text) {
    std::string output;
    FILE* pipe = ::popen(text.c_str(), "r");
    char buffer[4096];
    size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
    const int status = ::pclose(pipe);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
  };
  const auto [code, output] = run_command(command);
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find("iteration        3/       3"), std::string::npos) << output;
  EXPECT_EQ(output.find("kiln-secret-never-printed"), std::string::npos) << output;
  EXPECT_EQ(output.find("AWS4-HMAC"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(cache / "objects"));

  // Without credentials the server refuses, and the error names the object.
  const auto [denied_code, denied] =
      run_command("AWS_ENDPOINT_URL=" + server_->endpoint() + " AWS_ACCESS_KEY_ID=WRONG AWS_SECRET_ACCESS_KEY=kiln-secret-never-printed " +
                  binary + " train --data-path " + remote + " --vocab-size 61 --train-iters 1 2>&1");
  EXPECT_EQ(denied_code, 1) << denied;
  EXPECT_NE(denied.find("access denied"), std::string::npos) << denied;
  EXPECT_NE(denied.find(remote), std::string::npos) << denied;
  EXPECT_EQ(denied.find("kiln-secret-never-printed"), std::string::npos) << denied;
}

}  // namespace
}  // namespace kiln
