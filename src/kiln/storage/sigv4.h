// AWS Signature Version 4 for S3 requests (header-based authentication).
//
// The steps follow AWS's published description ("Signature Version 4 signing process",
// docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html):
//   canonical request = method \n canonical URI \n canonical query \n canonical headers \n
//                       signed header names \n payload hash
//   string to sign    = "AWS4-HMAC-SHA256" \n date-time \n scope \n hex(SHA-256(canonical request))
//   signing key       = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")
//   signature         = hex(HMAC(signing key, string to sign))
// S3 encodes each path segment once (other services twice); the caller passes the raw key path and
// sign_request encodes it. Header names are lower-cased and sorted, values trimmed.
// Tested against AWS's published examples (tests/storage/sigv4_test.cpp).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

struct SigV4Credentials {
  std::string access_key_id, secret_access_key, session_token;  // session token may be empty
};

struct SigV4Request {
  std::string method = "GET";
  std::string path = "/";  // raw (unencoded) path, e.g. "/bucket/dir/file name.bin"
  std::vector<std::pair<std::string, std::string>> query;    // raw names and values
  std::vector<std::pair<std::string, std::string>> headers;  // must include host and x-amz-date
  std::string payload_sha256;  // hex; the SHA-256 of the empty string for GET/HEAD
};

struct SigV4Scope {
  std::string region = "us-east-1", service = "s3";
};

// RFC 3986 unreserved characters stay, everything else becomes %XX (upper-case hex); '/' is kept
// when keep_slash is true (URI paths), encoded otherwise (query names and values).
std::string uri_encode(std::string_view text, bool keep_slash);
std::string sha256_hex(std::string_view data);
std::string hmac_sha256(std::string_view key, std::string_view data);  // raw 32 bytes
std::string to_hex(std::string_view bytes);

std::string canonical_request(const SigV4Request& request);
std::string string_to_sign(const SigV4Request& request, const SigV4Scope& scope, const std::string& amz_date);
std::string signing_key(const std::string& secret, const std::string& date, const SigV4Scope& scope);
// The value of the Authorization header. amz_date: "YYYYMMDDTHHMMSSZ", the request's x-amz-date.
std::string authorization_header(const SigV4Request& request, const SigV4Credentials& credentials,
                                 const SigV4Scope& scope, const std::string& amz_date);
// The current UTC time as "YYYYMMDDTHHMMSSZ".
std::string amz_date_now();

}  // namespace kiln
