// Minimal HTTP client over libcurl for the S3 storage back-end: a batch of requests performed
// concurrently (at most `max_in_flight` at once) on the calling thread. Each thread keeps its own
// libcurl multi handle, so connections stay open between batches (keep-alive) without locks.
//
// A response body either lands in the caller's buffer (`into`, exactly sized: a longer body is a
// transport error, a shorter one is reported through `received`) or in `body`. Error responses
// (status >= 300) always go to `body`, so a 403 or 404 can be read. No retries here: the caller
// decides what is worth retrying (s3_client.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string_view body;             // request body (PUT)
  std::span<uint8_t> into;           // where a successful body goes; empty: into HttpResponse::body
};

struct HttpResponse {
  long status = 0;             // 0 when the transport failed
  std::string transport_error; // libcurl's message when the transport failed (timeout, refused, ...)
  std::string body;            // error bodies, and success bodies when `into` was empty
  uint64_t received = 0;       // body bytes received
  std::vector<std::pair<std::string, std::string>> headers;  // lower-case names

  const std::string* header(std::string_view name) const;
};

struct HttpTimeouts {
  long connect_ms = 5000;
  long stall_seconds = 30;  // abort a transfer that moves less than one byte per second for this long
};

std::vector<HttpResponse> http_perform(std::span<const HttpRequest> requests, int max_in_flight,
                                       const HttpTimeouts& timeouts);

}  // namespace kiln
