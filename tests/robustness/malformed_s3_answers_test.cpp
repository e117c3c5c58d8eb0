// What an S3 endpoint (or a proxy in front of it) answers is input too: answers that cannot be
// S3's are refused with a kiln::Error naming the s3:// URI, never trusted, looped on or crashed on.
// Each test scripts the endpoint's raw HTTP answers (support/fault_http_server.h).
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "kiln/storage/s3_client.h"
#include "support/corruptions.h"
#include "support/error_of.h"
#include "support/fault_http_server.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::http_answer;
using testing::ScriptedHttpServer;

// A ListObjectsV2 page as S3 writes it, with the given <Contents> entries and trailer.
std::string listing(const std::string& contents, const std::string& trailer = "<IsTruncated>false</IsTruncated>") {
  return R"(<?xml version="1.0" encoding="UTF-8"?>)"
         R"(<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name>)"
         R"(<Prefix>data/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>)" +
         contents + trailer + "</ListBucketResult>";
}

std::string entry(const std::string& key, const std::string& size) {
  return "<Contents><Key>" + key + "</Key><LastModified>2026-11-24T00:00:00.000Z</LastModified>"
         "<ETag>&quot;abc&quot;</ETag><Size>" + size + "</Size><StorageClass>STANDARD</StorageClass></Contents>";
}

// The error (or "") of listing s3://bucket/data/ from an endpoint that answers every request with
// `answer`.
std::string listing_error(const std::string& answer) {
  ScriptedHttpServer server([&](int, const std::string&) { return answer; });
  const S3Client client(testing::s3_settings_for(server.endpoint()));
  return error_of([&] { client.list("bucket", "data/"); });
}

TEST(MalformedS3Answers, AHeadWithoutAByteCountIsRefused) {
  for (const std::string length : {"abc", "-5", "12x", "99999999999999999999"}) {
    ScriptedHttpServer server(
        [&](int, const std::string&) { return http_answer("200 OK", "Content-Length: " + length + "\r\n", ""); });
    const S3Client client(testing::s3_settings_for(server.endpoint()));
    const std::string error = error_of([&] { client.head({"bucket", "key.bin"}); });
    EXPECT_NE(error.find("s3://bucket/key.bin: "), std::string::npos) << length << ": " << error;
  }
}

TEST(MalformedS3Answers, ARangedReadAnsweredWithOtherBytesIsRefused) {
  const auto read_bytes_10_to_19 = [](const std::string& answer) {
    ScriptedHttpServer server([&](int, const std::string&) { return answer; });
    const S3Client client(testing::s3_settings_for(server.endpoint()));
    std::vector<uint8_t> out(10);
    const S3RangeRead range{10, out};
    return error_of([&] { client.read_ranges({"bucket", "key.bin"}, {&range, 1}); });
  };
  const std::string body = "0123456789";
  EXPECT_EQ(read_bytes_10_to_19(http_answer("206 Partial Content", "Content-Range: bytes 10-19/40\r\n", body)), "");
  EXPECT_NE(read_bytes_10_to_19(http_answer("206 Partial Content", "Content-Range: bytes 0-9/40\r\n", body))
                .find("s3://bucket/key.bin: asked for bytes 10-19, the S3 endpoint answered HTTP 206 with "
                      "Content-Range 'bytes 0-9/40'"),
            std::string::npos);
  EXPECT_NE(read_bytes_10_to_19(http_answer("206 Partial Content", "", body)).find("asked for bytes 10-19"),
            std::string::npos);
  // A server that ignores Range and sends the whole object from byte 0.
  EXPECT_NE(read_bytes_10_to_19(http_answer("200 OK", "", body)).find("asked for bytes 10-19"), std::string::npos);
}

TEST(MalformedS3Answers, ListingsThatCannotBeS3sAreRefused) {
  EXPECT_EQ(listing_error(http_answer("200 OK", "", listing(entry("data/a.bin", "10") + entry("data/b.bin", "0")))),
            "");
  EXPECT_NE(listing_error(http_answer("200 OK", "", "<html>\n<body>Proxy login</body></html>"))
                .find("s3://bucket/data/: the S3 endpoint's listing is not a ListBucketResult: '<html> <body>"),
            std::string::npos);  // the answer's start, on the error's one line
  EXPECT_NE(listing_error(http_answer("200 OK", "", listing(entry("data/a.bin", "ten"))))
                .find("s3://bucket/data/: the S3 endpoint's listing has an entry with key 'data/a.bin' and size 'ten'"),
            std::string::npos);
  EXPECT_NE(listing_error(http_answer("200 OK", "", listing(entry("", "10")))).find("with key '' and size '10'"),
            std::string::npos);
  EXPECT_NE(listing_error(http_answer("200 OK", "", listing(entry("data/a.bin", "1"), "<IsTruncated>true</IsTruncated>")))
                .find("truncated but gives no continuation token"),
            std::string::npos);
  // An endpoint that hands out the same page forever.
  EXPECT_NE(listing_error(http_answer("200 OK", "",
                                      listing(entry("data/a.bin", "1"), "<IsTruncated>true</IsTruncated>"
                                                                         "<NextContinuationToken>t1</NextContinuationToken>")))
                .find("repeats the continuation token 't1'"),
            std::string::npos);
}

TEST(MalformedS3Answers, ListingKeysDecodeCharacterReferencesToUtf8) {
  const std::string answer =
      http_answer("200 OK", "", listing(entry("data/caf&#xE9;&#8364;.bin", "3") + entry("data/x&#0;y&#xD800;.bin", "4")));
  ScriptedHttpServer server([&](int, const std::string&) { return answer; });
  const S3Client client(testing::s3_settings_for(server.endpoint()));
  const std::vector<S3ObjectInfo> objects = client.list("bucket", "data/");
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0].key, "data/caf\xc3\xa9\xe2\x82\xac.bin");  // é and €
  EXPECT_EQ(objects[0].etag, "\"abc\"");
  EXPECT_EQ(objects[1].key, "data/x&#0;y&#xD800;.bin");  // no character: left as written
}

TEST(MalformedS3Answers, CorruptedListingsAreRefusedByNameOrRead) {
  const std::string valid = listing(entry("data/a.bin", "10") + entry("data/b&amp;c.bin", "20"),
                                    "<IsTruncated>false</IsTruncated>");
  testing::CorruptionOptions options;
  options.text = true;
  options.random_edits = 150;
  options.header_bytes = 0;
  std::mutex mutex;
  std::string answer;
  ScriptedHttpServer server([&](int, const std::string&) {
    const std::lock_guard lock(mutex);
    return answer;
  });
  const S3Client client(testing::s3_settings_for(server.endpoint()));
  int refused = 0, read = 0;
  for (const testing::Corruption& corruption : testing::corruptions_of(valid, options)) {
    {
      const std::lock_guard lock(mutex);
      answer = http_answer("200 OK", "", corruption.bytes);
    }
    const std::string error = error_of([&] { client.list("bucket", "data/"); });
    (error.empty() ? read : refused) += 1;
    if (!error.empty()) {
      EXPECT_NE(error.find("s3://bucket/data/"), std::string::npos) << corruption.what << ": " << error;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(read, 0);
}

}  // namespace
}  // namespace kiln
