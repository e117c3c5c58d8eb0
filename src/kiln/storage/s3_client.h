// S3 client: HEAD, ranged GETs (several in flight), whole-object GET, PUT and ListObjectsV2, signed
// with AWS Signature V4 (sigv4.h), over libcurl (http.h).
//
// Settings come from the standard environment variables (S3Settings::from_environment):
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN   credentials (never printed);
//                                                                  none set: unsigned requests
//   AWS_REGION or AWS_DEFAULT_REGION                               region (default us-east-1)
//   AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL                        endpoint (default AWS's, https)
// Addressing: path-style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint-host/key);
// Auto picks path-style for a custom endpoint (MinIO, Ceph, s3rver ...) and virtual-hosted for AWS.
//
// Retries: a transport failure (refused, reset, timeout, short body) and HTTP 5xx or 429 are
// retried up to max_attempts with exponential backoff (initial, doubling, capped, with jitter);
// other statuses fail at once. Every error names the s3:// URI and, for HTTP errors, the status and
// S3's error code (AccessDenied, NoSuchKey, ...). Answers are checked, not trusted: a HEAD's
// Content-Length must be a byte count, a ranged read's 206 must name the range asked for (a 200,
// the whole object, only answers a range from byte 0), and a listing must be a ListBucketResult
// whose entries have a key and a byte count and whose continuation tokens never repeat. Thread-safe:
// each call runs on its caller's thread with that thread's connections.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/storage/http.h"
#include "kiln/storage/sigv4.h"

namespace kiln {

struct S3Location {
  std::string bucket, key;
  std::string uri() const { return "s3://" + bucket + "/" + key; }
};
bool is_s3_uri(std::string_view path);
// "s3://bucket/key/parts" -> {bucket, "key/parts"}; errors name the URI.
S3Location parse_s3_uri(const std::string& uri);

enum class S3Addressing { Auto, Path, VirtualHosted };
S3Addressing parse_s3_addressing(const std::string& text);  // "auto", "path", "virtual"

struct S3Settings {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  bool custom_endpoint = false;
  std::string region = "us-east-1";
  S3Addressing addressing = S3Addressing::Auto;
  SigV4Credentials credentials;
  int max_attempts = 5;
  double backoff_initial_ms = 100, backoff_max_ms = 5000;
  HttpTimeouts timeouts;
  int max_in_flight = 8;

  static S3Settings from_environment();
};

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

struct S3RangeRead {
  uint64_t offset = 0;
  std::span<uint8_t> out;  // reads out.size() bytes at offset
};

class S3Client {
 public:
  explicit S3Client(S3Settings settings);

  const S3Settings& settings() const { return settings_; }
  // Size and ETag; nullopt when the object does not exist.
  std::optional<S3ObjectInfo> head(const S3Location& location) const;
  // Fills every range, up to max_in_flight requests at once.
  void read_ranges(const S3Location& location, std::span<const S3RangeRead> ranges) const;
  std::string get(const S3Location& location) const;
  void put(const S3Location& location, std::string_view body) const;
  // Objects directly under `prefix` (a "folder" ending in '/', or any key prefix), all pages of
  // at most page_size keys each.
  std::vector<S3ObjectInfo> list(const std::string& bucket, const std::string& prefix, int page_size = 1000) const;

  // HTTP requests sent so far (attempts, including retries): for tests and the loader bench.
  uint64_t requests_sent() const { return requests_sent_.load(); }

 private:
  struct Call {
    std::string method = "GET";
    S3Location location;
    std::vector<std::pair<std::string, std::string>> query;
    std::vector<std::pair<std::string, std::string>> headers;  // besides host, date, hash, token
    std::string_view body;
    std::span<uint8_t> into;
  };
  HttpRequest sign(const Call& call) const;
  // Performs the calls with retries; returns the final responses (2xx, or 404 when allow_404).
  std::vector<HttpResponse> perform(std::span<const Call> calls, bool allow_404) const;

  S3Settings settings_;
  mutable std::atomic<uint64_t> requests_sent_{0};
};

}  // namespace kiln
