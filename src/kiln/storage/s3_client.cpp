#include "kiln/storage/s3_client.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr const char* kEmptyPayloadSha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

// scheme://host[:port] -> host[:port]
std::string host_of(const std::string& endpoint) {
  const size_t scheme = endpoint.find("://");
  return scheme == std::string::npos ? endpoint : endpoint.substr(scheme + 3);
}
std::string scheme_of(const std::string& endpoint) {
  const size_t scheme = endpoint.find("://");
  return scheme == std::string::npos ? "https" : endpoint.substr(0, scheme);
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | code_point >> 6);
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | code_point >> 12);
    out += static_cast<char>(0x80 | (code_point >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | code_point >> 18);
    out += static_cast<char>(0x80 | (code_point >> 12 & 0x3f));
    out += static_cast<char>(0x80 | (code_point >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

// XML's character references "#123" and "#x7b": a code point XML allows (not 0, not a surrogate).
bool character_reference(std::string_view entity, uint32_t& code_point) {
  if (!entity.starts_with('#')) return false;
  const bool hex = entity.starts_with("#x");
  const std::string_view digits = entity.substr(hex ? 2 : 1);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), code_point, hex ? 16 : 10);
  return error == std::errc() && end == digits.data() + digits.size() && !digits.empty() && code_point != 0 &&
         code_point <= 0x10ffff && (code_point < 0xd800 || code_point > 0xdfff);
}

// A decimal number of bytes as S3 writes it (Content-Length, <Size>): digits only, within 64 bits.
std::optional<uint64_t> parse_byte_count(std::string_view text) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The start of an endpoint's answer for an error message: at most 200 bytes, on one line.
std::string answer_excerpt(std::string_view answer) {
  std::string excerpt(answer.substr(0, 200));
  std::replace_if(excerpt.begin(), excerpt.end(), [](char c) { return c == '\n' || c == '\r' || c == '\t'; }, ' ');
  return excerpt;
}

// Whether a 206 answer's Content-Range ("bytes FIRST-LAST/TOTAL") is the range that was asked for.
bool answers_range(const HttpResponse& response, uint64_t first, uint64_t last) {
  const std::string* range = response.header("content-range");
  if (range == nullptr || !range->starts_with("bytes ")) return false;
  const std::string_view text = std::string_view(*range).substr(6);
  const size_t dash = text.find('-'), slash = text.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return false;
  return parse_byte_count(text.substr(0, dash)) == first && parse_byte_count(text.substr(dash + 1, slash - dash - 1)) == last;
}

std::string xml_unescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    const size_t end = text.find(';', i);
    const std::string_view entity = end == std::string_view::npos ? std::string_view() : text.substr(i + 1, end - i - 1);
    if (entity == "amp") out += '&';
    else if (entity == "lt") out += '<';
    else if (entity == "gt") out += '>';
    else if (entity == "quot") out += '"';
    else if (entity == "apos") out += '\'';
    else if (uint32_t code_point = 0; character_reference(entity, code_point)) append_utf8(out, code_point);
    else {
      out += '&';
      continue;
    }
    i = end;
  }
  return out;
}

// The text of each <tag>...</tag> in `xml`, in order (no nesting of the same tag in S3's answers).
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> found;
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  size_t at = 0;
  while ((at = xml.find(open, at)) != std::string_view::npos) {
    const size_t begin = at + open.size();
    const size_t end = xml.find(close, begin);
    if (end == std::string_view::npos) break;
    found.push_back(xml.substr(begin, end - begin));
    at = end + close.size();
  }
  return found;
}

// Whether `xml` opens a <tag> element (attributes allowed, as in <ListBucketResult xmlns="...">).
bool has_element(std::string_view xml, std::string_view tag) {
  const std::string open = "<" + std::string(tag);
  for (size_t at = xml.find(open); at != std::string_view::npos; at = xml.find(open, at + 1)) {
    const size_t after = at + open.size();
    if (after < xml.size() && (xml[after] == '>' || xml[after] == ' ')) return true;
  }
  return false;
}

std::string xml_first(std::string_view xml, std::string_view tag) {
  const auto found = xml_elements(xml, tag);
  return found.empty() ? std::string() : xml_unescape(found.front());
}

bool retryable(const HttpResponse& response) {
  return response.status == 0 || response.status >= 500 || response.status == 429;
}

std::string describe_failure(const HttpResponse& response) {
  if (response.status == 0) return response.transport_error;
  std::string text = "HTTP " + std::to_string(response.status);
  const std::string code = xml_first(response.body, "Code");
  if (!code.empty()) text.append(" ").append(code);
  const std::string message = xml_first(response.body, "Message");
  if (!message.empty()) text.append(": ").append(message);
  return text;
}

}  // namespace

bool is_s3_uri(std::string_view path) { return path.starts_with("s3://"); }

S3Location parse_s3_uri(const std::string& uri) {
  KILN_CHECK(is_s3_uri(uri), "'{}' is not an s3:// URI", uri);
  const std::string rest = uri.substr(5);
  const size_t slash = rest.find('/');
  S3Location location{rest.substr(0, slash), slash == std::string::npos ? std::string() : rest.substr(slash + 1)};
  KILN_CHECK(!location.bucket.empty(), "'{}' names no bucket (expected s3://bucket/key)", uri);
  return location;
}

S3Addressing parse_s3_addressing(const std::string& text) {
  if (text == "auto") return S3Addressing::Auto;
  if (text == "path") return S3Addressing::Path;
  if (text == "virtual") return S3Addressing::VirtualHosted;
  fail("S3 addressing style '{}' is not auto, path or virtual", text);
}

S3Settings S3Settings::from_environment() {
  S3Settings settings;
  settings.region = env("AWS_REGION");
  if (settings.region.empty()) settings.region = env("AWS_DEFAULT_REGION");
  if (settings.region.empty()) settings.region = "us-east-1";
  settings.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (settings.endpoint.empty()) settings.endpoint = env("AWS_ENDPOINT_URL");
  settings.custom_endpoint = !settings.endpoint.empty();
  if (!settings.custom_endpoint) settings.endpoint = "https://s3." + settings.region + ".amazonaws.com";
  while (!settings.endpoint.empty() && settings.endpoint.back() == '/') settings.endpoint.pop_back();
  settings.credentials.access_key_id = env("AWS_ACCESS_KEY_ID");
  settings.credentials.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
  settings.credentials.session_token = env("AWS_SESSION_TOKEN");
  KILN_CHECK(settings.credentials.access_key_id.empty() == settings.credentials.secret_access_key.empty(),
             "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together (only {} is set)",
             settings.credentials.access_key_id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
  return settings;
}

S3Client::S3Client(S3Settings settings) : settings_(std::move(settings)) {
  KILN_CHECK(settings_.max_attempts >= 1, "S3: max_attempts must be at least 1");
}

HttpRequest S3Client::sign(const Call& call) const {
  const bool path_style = settings_.addressing == S3Addressing::Path ||
                          (settings_.addressing == S3Addressing::Auto && settings_.custom_endpoint);
  const std::string endpoint_host = host_of(settings_.endpoint);
  const std::string host = path_style ? endpoint_host : call.location.bucket + "." + endpoint_host;
  const std::string path = path_style ? "/" + call.location.bucket + "/" + call.location.key : "/" + call.location.key;

  SigV4Request request;
  request.method = call.method;
  request.path = path;
  request.query = call.query;
  request.payload_sha256 = call.body.empty() ? kEmptyPayloadSha256 : sha256_hex(call.body);
  const std::string date = amz_date_now();
  request.headers = call.headers;
  request.headers.emplace_back("host", host);
  request.headers.emplace_back("x-amz-date", date);
  request.headers.emplace_back("x-amz-content-sha256", request.payload_sha256);
  if (!settings_.credentials.session_token.empty())
    request.headers.emplace_back("x-amz-security-token", settings_.credentials.session_token);

  HttpRequest http;
  http.method = call.method;
  http.url = scheme_of(settings_.endpoint) + "://" + host + uri_encode(path, true);
  for (size_t i = 0; i < call.query.size(); ++i) {
    http.url += i ? '&' : '?';
    http.url.append(uri_encode(call.query[i].first, false)).append("=").append(uri_encode(call.query[i].second, false));
  }
  for (const auto& [name, value] : request.headers) http.headers.push_back(name + ": " + value);
  if (!settings_.credentials.access_key_id.empty())
    http.headers.push_back("Authorization: " +
                           authorization_header(request, settings_.credentials, {settings_.region, "s3"}, date));
  http.body = call.body;
  http.into = call.into;
  return http;
}

std::vector<HttpResponse> S3Client::perform(std::span<const Call> calls, bool allow_404) const {
  std::vector<HttpResponse> results(calls.size());
  std::vector<size_t> pending(calls.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  thread_local std::minstd_rand jitter(std::random_device{}());
  double delay_ms = settings_.backoff_initial_ms;
  for (int attempt = 1; !pending.empty(); ++attempt) {
    std::vector<HttpRequest> requests;
    for (size_t index : pending) requests.push_back(sign(calls[index]));
    std::vector<HttpResponse> responses = http_perform(requests, settings_.max_in_flight, settings_.timeouts);
    requests_sent_ += requests.size();
    std::vector<size_t> again;
    for (size_t r = 0; r < pending.size(); ++r) {
      const Call& call = calls[pending[r]];
      HttpResponse& response = responses[r];
      const bool ok = response.status >= 200 && response.status < 300;
      if (ok && !call.into.empty() && response.received != call.into.size()) {
        response.transport_error = "short body: " + std::to_string(response.received) + " of " +
                                   std::to_string(call.into.size()) + " bytes";
        response.status = 0;
      }
      if ((response.status >= 200 && response.status < 300) || (allow_404 && response.status == 404)) {
        results[pending[r]] = std::move(response);
        continue;
      }
      const std::string uri = call.location.uri();
      if (!retryable(response)) {
        const bool anonymous = settings_.credentials.access_key_id.empty();
        if (response.status == 403)
          fail("{}: access denied ({}){}", uri, describe_failure(response),
               anonymous ? "; no credentials are set (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
                         : "; check the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN");
        if (response.status == 404) fail("{}: not found ({})", uri, describe_failure(response));
        fail("{}: {} {}", uri, call.method, describe_failure(response));
      }
      if (attempt >= settings_.max_attempts) {
        if (response.status == 0)
          fail("{}: cannot read from the S3 endpoint {} after {} attempts: {}", uri, settings_.endpoint, attempt,
               describe_failure(response));
        fail("{}: {} after {} attempts", uri, describe_failure(response), attempt);
      }
      again.push_back(pending[r]);
    }
    pending = std::move(again);
    if (pending.empty()) break;
    const double sleep_ms = delay_ms * (0.5 + 0.5 * std::uniform_real_distribution<double>(0, 1)(jitter));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(sleep_ms));
    delay_ms = std::min(delay_ms * 2, settings_.backoff_max_ms);
  }
  return results;
}

std::optional<S3ObjectInfo> S3Client::head(const S3Location& location) const {
  Call call;
  call.method = "HEAD";
  call.location = location;
  const HttpResponse response = std::move(perform({&call, 1}, /*allow_404=*/true).front());
  if (response.status == 404) return std::nullopt;
  S3ObjectInfo info;
  info.key = location.key;
  const std::string* length = response.header("content-length");
  KILN_CHECK(length != nullptr, "{}: the S3 endpoint sent no Content-Length for HEAD", location.uri());
  const std::optional<uint64_t> size = parse_byte_count(*length);
  KILN_CHECK(size.has_value(), "{}: the S3 endpoint answered HEAD with Content-Length '{}', not a byte count",
             location.uri(), *length);
  info.size = *size;
  if (const std::string* etag = response.header("etag")) info.etag = *etag;
  return info;
}

void S3Client::read_ranges(const S3Location& location, std::span<const S3RangeRead> ranges) const {
  std::vector<Call> calls;
  for (const S3RangeRead& range : ranges) {
    if (range.out.empty()) continue;
    Call call;
    call.location = location;
    call.headers.emplace_back("range", "bytes=" + std::to_string(range.offset) + "-" +
                                           std::to_string(range.offset + range.out.size() - 1));
    call.into = range.out;
    calls.push_back(std::move(call));
  }
  const std::vector<HttpResponse> responses = perform(calls, /*allow_404=*/false);
  size_t call = 0;
  for (const S3RangeRead& range : ranges) {
    if (range.out.empty()) continue;
    const HttpResponse& response = responses[call++];
    const uint64_t last = range.offset + range.out.size() - 1;
    // 206 must say which bytes it holds; a 200 (the whole object) is right only for a range from 0.
    KILN_CHECK(response.status == 206 ? answers_range(response, range.offset, last) : range.offset == 0,
               "{}: asked for bytes {}-{}, the S3 endpoint answered HTTP {} with Content-Range '{}'", location.uri(),
               range.offset, last, response.status,
               response.header("content-range") ? *response.header("content-range") : "");
  }
}

std::string S3Client::get(const S3Location& location) const {
  Call call;
  call.location = location;
  return std::move(perform({&call, 1}, /*allow_404=*/false).front().body);
}

void S3Client::put(const S3Location& location, std::string_view body) const {
  Call call;
  call.method = "PUT";
  call.location = location;
  call.body = body;
  perform({&call, 1}, /*allow_404=*/false);
}

std::vector<S3ObjectInfo> S3Client::list(const std::string& bucket, const std::string& prefix, int page_size) const {
  const std::string where = S3Location{bucket, prefix}.uri();
  std::vector<S3ObjectInfo> objects;
  std::set<std::string> tokens_seen;
  std::string token;
  for (;;) {
    Call call;
    call.location = {bucket, ""};
    call.query = {{"list-type", "2"}, {"prefix", prefix}, {"delimiter", "/"}, {"max-keys", std::to_string(page_size)}};
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    const std::string xml = std::move(perform({&call, 1}, /*allow_404=*/false).front().body);
    KILN_CHECK(has_element(xml, "ListBucketResult"),
               "{}: the S3 endpoint's listing is not a ListBucketResult: '{}'", where, answer_excerpt(xml));
    for (std::string_view contents : xml_elements(xml, "Contents")) {
      S3ObjectInfo info;
      info.key = xml_first(contents, "Key");
      const std::string size = xml_first(contents, "Size");
      const std::optional<uint64_t> bytes = parse_byte_count(size);
      KILN_CHECK(!info.key.empty() && bytes.has_value(),
                 "{}: the S3 endpoint's listing has an entry with key '{}' and size '{}'", where, info.key, size);
      info.size = *bytes;
      info.etag = xml_first(contents, "ETag");
      objects.push_back(std::move(info));
    }
    if (xml_first(xml, "IsTruncated") != "true") break;
    token = xml_first(xml, "NextContinuationToken");
    KILN_CHECK(!token.empty(), "{}: the S3 endpoint's listing is truncated but gives no continuation token", where);
    KILN_CHECK(tokens_seen.insert(token).second,
               "{}: the S3 endpoint's listing repeats the continuation token '{}' (it would never end)", where, token);
  }
  return objects;
}

}  // namespace kiln
