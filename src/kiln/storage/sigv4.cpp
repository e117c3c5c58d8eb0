#include "kiln/storage/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "kiln/core/error.h"

namespace kiln {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Trims the ends and collapses inner runs of spaces to one, as the canonical header value requires.
std::string trim_header_value(std::string_view value) {
  std::string out;
  bool space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> canonical_headers(const SigV4Request& request) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : request.headers) headers.emplace_back(lower(name), trim_header_value(value));
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string signed_header_names(const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string names;
  for (const auto& header : headers) {
    if (!names.empty()) names += ';';
    names += header.first;
  }
  return names;
}

std::string credential_date(const std::string& amz_date) { return amz_date.substr(0, 8); }

std::string scope_string(const std::string& amz_date, const SigV4Scope& scope) {
  std::string text = credential_date(amz_date);
  text.append("/").append(scope.region).append("/").append(scope.service).append("/aws4_request");
  return text;
}

}  // namespace

std::string uri_encode(std::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  KILN_CHECK(EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) == 1,
             "OpenSSL SHA-256 failed");
  return to_hex(std::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  KILN_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &length) != nullptr,
             "OpenSSL HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string canonical_request(const SigV4Request& request) {
  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [name, value] : request.query) query.emplace_back(uri_encode(name, false), uri_encode(value, false));
  std::sort(query.begin(), query.end());
  std::string text = request.method;
  text.append("\n").append(uri_encode(request.path, true)).append("\n");
  for (size_t i = 0; i < query.size(); ++i) {
    if (i) text += '&';
    text.append(query[i].first).append("=").append(query[i].second);
  }
  text += '\n';
  const auto headers = canonical_headers(request);
  for (const auto& [name, value] : headers) text.append(name).append(":").append(value).append("\n");
  text.append("\n").append(signed_header_names(headers)).append("\n").append(request.payload_sha256);
  return text;
}

std::string string_to_sign(const SigV4Request& request, const SigV4Scope& scope, const std::string& amz_date) {
  std::string text = "AWS4-HMAC-SHA256\n";
  text.append(amz_date).append("\n").append(scope_string(amz_date, scope)).append("\n");
  text.append(sha256_hex(canonical_request(request)));
  return text;
}

std::string signing_key(const std::string& secret, const std::string& date, const SigV4Scope& scope) {
  const std::string date_key = hmac_sha256("AWS4" + secret, date);
  const std::string region_key = hmac_sha256(date_key, scope.region);
  const std::string service_key = hmac_sha256(region_key, scope.service);
  return hmac_sha256(service_key, "aws4_request");
}

std::string authorization_header(const SigV4Request& request, const SigV4Credentials& credentials,
                                 const SigV4Scope& scope, const std::string& amz_date) {
  KILN_CHECK(amz_date.size() == 16 && amz_date[8] == 'T' && amz_date[15] == 'Z',
             "SigV4: x-amz-date '{}' is not YYYYMMDDTHHMMSSZ", amz_date);
  const std::string key = signing_key(credentials.secret_access_key, credential_date(amz_date), scope);
  const std::string signature = to_hex(hmac_sha256(key, string_to_sign(request, scope, amz_date)));
  std::string header = "AWS4-HMAC-SHA256 Credential=";
  header.append(credentials.access_key_id).append("/").append(scope_string(amz_date, scope));
  header.append(",SignedHeaders=").append(signed_header_names(canonical_headers(request)));
  header.append(",Signature=").append(signature);
  return header;
}

std::string amz_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[17];
  std::strftime(text, sizeof(text), "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

}  // namespace kiln
