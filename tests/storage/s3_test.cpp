// The S3 client and S3-backed files against a real S3-compatible server (s3rver on 127.0.0.1),
// and against a deliberately faulty HTTP server for retries, timeouts and short bodies.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/storage/chunk_cache.h"
#include "kiln/storage/s3_file.h"
#include "kiln/storage/storage.h"
#include "support/error_of.h"
#include "support/fault_http_server.h"
#include "support/s3rver.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::FaultHttpServer;

std::string random_bytes(size_t count, uint64_t seed) {
  Rng rng(seed);
  std::string bytes(count, '\0');
  for (char& c : bytes) c = static_cast<char>(rng.below(256));
  return bytes;
}

std::string s3_uri(const std::string& key) { return std::string("s3://") + testing::S3rver::kBucket + "/" + key; }

class S3 : public testing::S3rverTest {
 protected:
  void SetUp() override {
    S3rverTest::SetUp();
    if (!IsSkipped()) client_ = std::make_shared<S3Client>(server_->settings());
  }
  StorageOptions storage_options(const std::string& cache_dir = "") const {
    return S3rverTest::storage_options(cache_dir, 64 * 1024);
  }

  std::shared_ptr<S3Client> client_;
};

TEST_F(S3, PutHeadGetAndRangedReadsInFlightTogether) {
  const std::string object = random_bytes(300000, 1);
  client_->put({testing::S3rver::kBucket, "ranges/object.bin"}, object);
  const auto info = client_->head({testing::S3rver::kBucket, "ranges/object.bin"});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->size, object.size());
  EXPECT_FALSE(info->etag.empty());
  EXPECT_EQ(client_->get({testing::S3rver::kBucket, "ranges/object.bin"}), object);
  EXPECT_FALSE(client_->head({testing::S3rver::kBucket, "ranges/absent.bin"}).has_value());

  // A file split into 7 KB parts: one read becomes many ranged GETs in flight at once.
  S3File file(client_, s3_uri("ranges/object.bin"), 7000);
  EXPECT_EQ(file.size(), object.size());
  std::vector<uint8_t> all(object.size());
  const uint64_t before = client_->requests_sent();
  file.read(0, all);
  EXPECT_EQ(client_->requests_sent() - before, (object.size() + 6999) / 7000);
  EXPECT_EQ(std::string(all.begin(), all.end()), object);
  std::vector<uint8_t> a(10), b(12345), c(1);
  const ReadRange ranges[] = {{5, a}, {150000, b}, {object.size() - 1, c}};
  file.read_many(ranges);
  EXPECT_EQ(std::string(a.begin(), a.end()), object.substr(5, 10));
  EXPECT_EQ(std::string(b.begin(), b.end()), object.substr(150000, 12345));
  EXPECT_EQ(c[0], static_cast<uint8_t>(object.back()));
  EXPECT_NE(error_of([&] { file.read(object.size() - 2, a); }).find("runs past the end"), std::string::npos);
}

TEST_F(S3, ListsTheObjectsOfAFolderAcrossPages) {
  for (const char* name : {"list/b.bin", "list/a.bin", "list/c.txt", "list/sub/d.bin", "listing-not/e.bin"})
    client_->put({testing::S3rver::kBucket, name}, name);
  const auto objects = client_->list(testing::S3rver::kBucket, "list/");
  std::vector<std::string> keys;
  for (const auto& object : objects) keys.push_back(object.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"list/a.bin", "list/b.bin", "list/c.txt"}));
  EXPECT_EQ(objects[0].size, std::string("list/a.bin").size());
  const uint64_t before = client_->requests_sent();
  const auto paged = client_->list(testing::S3rver::kBucket, "list/", 2);  // pages of 2, 2 + 1 keys
  EXPECT_EQ(client_->requests_sent() - before, 2u);
  ASSERT_EQ(paged.size(), 3u);
  EXPECT_EQ(paged[2].key, "list/c.txt");

  const Storage storage(storage_options());
  EXPECT_EQ(storage.list(s3_uri("list")), (std::vector<std::string>{"a.bin", "b.bin", "c.txt"}));
  EXPECT_TRUE(storage.exists(s3_uri("list/a.bin")));
  EXPECT_FALSE(storage.exists(s3_uri("list/zzz.bin")));
  EXPECT_EQ(storage.read_all(s3_uri("list/c.txt")), "list/c.txt");
}

TEST_F(S3, MissingObjectsAndBucketsAndBadCredentialsAreNamedErrors) {
  const std::string missing = error_of([&] { S3File(client_, s3_uri("nothing/here.bin")); });
  EXPECT_NE(missing.find(s3_uri("nothing/here.bin")), std::string::npos) << missing;
  EXPECT_NE(missing.find("404"), std::string::npos) << missing;

  const std::string no_bucket = error_of([&] { client_->list("no-such-bucket", ""); });
  EXPECT_NE(no_bucket.find("s3://no-such-bucket/"), std::string::npos) << no_bucket;
  EXPECT_NE(no_bucket.find("NoSuchBucket"), std::string::npos) << no_bucket;

  S3Settings wrong = server_->settings();
  wrong.credentials = {"NOT-A-KEY", "secret-that-must-not-leak", ""};
  const S3Client denied(wrong);
  client_->put({testing::S3rver::kBucket, "denied.bin"}, "x");
  const uint64_t before = denied.requests_sent();
  const std::string message = error_of([&] { denied.get({testing::S3rver::kBucket, "denied.bin"}); });
  EXPECT_NE(message.find("access denied"), std::string::npos) << message;
  EXPECT_NE(message.find("403"), std::string::npos) << message;
  EXPECT_NE(message.find(s3_uri("denied.bin")), std::string::npos) << message;
  EXPECT_EQ(message.find("secret-that-must-not-leak"), std::string::npos) << message;
  EXPECT_EQ(denied.requests_sent() - before, 1u) << "a 403 is not retried";
}

TEST_F(S3, UnreachableEndpointFailsAfterTheRetriesWithoutHanging) {
  S3Settings settings = server_->settings();
  settings.endpoint = "http://127.0.0.1:" + std::to_string(dist::find_free_port());
  const S3Client client(settings);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { client.head({"bucket", "key.bin"}); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(message.find("cannot read from the S3 endpoint " + settings.endpoint), std::string::npos) << message;
  EXPECT_NE(message.find("after 3 attempts"), std::string::npos) << message;
  EXPECT_EQ(client.requests_sent(), 3u);
}

TEST_F(S3, CacheDirectoryFillsLazilyAndServesLaterReadsLocally) {
  testing::TempDir cache;
  const std::string object = random_bytes(200000, 2);  // 4 chunks of 64 KiB (the last one short)
  client_->put({testing::S3rver::kBucket, "cached/data.bin"}, object);
  const Storage storage(storage_options(cache.path()));
  const auto file = storage.open(s3_uri("cached/data.bin"));
  const auto& cached = dynamic_cast<const ChunkCachedFile&>(*file);
  std::vector<uint8_t> part(1000);
  file->read(70000, part);  // chunk 1 only
  EXPECT_EQ(std::string(part.begin(), part.end()), object.substr(70000, 1000));
  EXPECT_EQ(cached.stats().chunks_fetched, 1u);
  const uint64_t requests = storage.s3()->requests_sent();
  file->read(65536 + 5, part);  // the same chunk: from disk
  EXPECT_EQ(storage.s3()->requests_sent(), requests);
  EXPECT_EQ(cached.stats().local_reads, 1u);

  std::vector<uint8_t> all(object.size());
  file->read(0, all);  // fetches chunks 0, 2, 3 together
  EXPECT_EQ(std::string(all.begin(), all.end()), object);
  EXPECT_EQ(cached.stats().chunks_fetched, 4u);
  EXPECT_EQ(cached.stats().bytes_fetched, object.size());

  // A second "epoch" in a new process-like Storage: no GET at all, only the HEAD of open().
  const Storage again(storage_options(cache.path()));
  const auto reopened = again.open(s3_uri("cached/data.bin"));
  std::fill(all.begin(), all.end(), 0);
  reopened->read(0, all);
  EXPECT_EQ(std::string(all.begin(), all.end()), object);
  EXPECT_EQ(again.s3()->requests_sent(), 1u);

  // A torn chunk file (wrong size) is fetched again; a changed object gets a new cache folder.
  const std::string chunk = cached.folder() + "/chunk-00000002";
  std::filesystem::resize_file(chunk, 10);
  const auto third = Storage(storage_options(cache.path())).open(s3_uri("cached/data.bin"));
  third->read(0, all);
  EXPECT_EQ(std::string(all.begin(), all.end()), object);
  EXPECT_EQ(dynamic_cast<const ChunkCachedFile&>(*third).stats().chunks_fetched, 1u);
  const std::string changed = random_bytes(200000, 3);
  client_->put({testing::S3rver::kBucket, "cached/data.bin"}, changed);
  const auto fresh = Storage(storage_options(cache.path())).open(s3_uri("cached/data.bin"));
  fresh->read(0, all);
  EXPECT_EQ(std::string(all.begin(), all.end()), changed);
}

// ---- retries against a faulty server -------------------------------------------------------

S3Settings fault_settings(const FaultHttpServer& server) { return testing::s3_settings_for(server.endpoint()); }

TEST(S3Retries, ServerErrorsAndCutBodiesAreRetriedThenSucceed) {
  const std::string object = random_bytes(5000, 4);
  // 0: HEAD served; 1, 2: 503 and 500; 3: half a body; 4: served.
  FaultHttpServer server(object, [](int n) {
    using A = FaultHttpServer::Action;
    return n == 1 ? A::Status503 : n == 2 ? A::Status500 : n == 3 ? A::CloseMidBody : A::Serve;
  });
  const auto client = std::make_shared<S3Client>(fault_settings(server));
  S3File file(client, "s3://bucket/object.bin");
  std::vector<uint8_t> all(object.size());
  file.read(0, all);
  EXPECT_EQ(std::string(all.begin(), all.end()), object);
  EXPECT_EQ(server.requests(), 5);
}

TEST(S3Retries, PersistentServerErrorsFailAfterMaxAttempts) {
  FaultHttpServer server("x", [](int) { return FaultHttpServer::Action::Status500; });
  const S3Client client(fault_settings(server));
  const std::string message = error_of([&] { client.get({"bucket", "key.bin"}); });
  EXPECT_NE(message.find("s3://bucket/key.bin: HTTP 500 InternalError: injected after 4 attempts"), std::string::npos)
      << message;
  EXPECT_EQ(server.requests(), 4);
}

TEST(S3Retries, AServerThatStopsAnsweringTimesOut) {
  FaultHttpServer server("abc", [](int n) { return n < 1 ? FaultHttpServer::Action::Hang : FaultHttpServer::Action::Serve; });
  S3Settings settings = fault_settings(server);
  const S3Client client(settings);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(client.get({"bucket", "key.bin"}), "abc");  // the hung attempt times out, the retry succeeds
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  EXPECT_EQ(server.requests(), 2);
}

}  // namespace
}  // namespace kiln
