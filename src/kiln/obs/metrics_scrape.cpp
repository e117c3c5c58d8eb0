#include "kiln/obs/metrics_scrape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "kiln/core/error.h"
#include "kiln/storage/http.h"

namespace kiln {
namespace {

constexpr std::string_view kDefaultHost = "127.0.0.1";
constexpr std::string_view kScheme = "http://";
constexpr HttpTimeouts kScrapeTimeouts{.connect_ms = 1000, .stall_seconds = 1};

bool host_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

bool ipv6_char(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
}

[[noreturn]] void malformed(std::string_view text, std::string_view why) {
  fail(
      "'{}' is not a metrics endpoint: {} (give PORT, HOST:PORT, [IPV6]:PORT or "
      "http://HOST:PORT/metrics)",
      text, why);
}

int parse_port(std::string_view digits, std::string_view text) {
  int port = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size())
    malformed(text, fmt::format("the port '{}' is not a number", digits));
  if (port < 1 || port > 65535) malformed(text, fmt::format("port {} is not in [1, 65535]", port));
  return port;
}

}  // namespace

std::string MetricsEndpoint::name() const {
  return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port)
                                             : fmt::format("[{}]:{}", host, port);
}

std::string MetricsEndpoint::url() const { return fmt::format("http://{}/metrics", name()); }

MetricsEndpoint parse_metrics_endpoint(std::string_view text) {
  std::string_view rest = text;
  if (rest.starts_with(kScheme)) {
    rest.remove_prefix(kScheme.size());
    const size_t slash = rest.find('/');
    if (slash != std::string_view::npos) {
      const std::string_view path = rest.substr(slash);
      if (path != "/metrics" && path != "/")
        malformed(text, fmt::format("kiln serves /metrics, not {}", path));
      rest = rest.substr(0, slash);
    }
  }
  if (!rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      }))
    return {std::string(kDefaultHost), parse_port(rest, text)};
  std::string_view host;
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) malformed(text, "the IPv6 address has no closing ']'");
    host = rest.substr(1, close - 1);
    if (host.empty() || !std::all_of(host.begin(), host.end(), ipv6_char))
      malformed(text, fmt::format("'{}' is not an IPv6 address", host));
    rest.remove_prefix(close + 1);
    if (!rest.starts_with(':')) malformed(text, "a ':PORT' must follow the ']'");
  } else {
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos) malformed(text, "it has no port");
    host = rest.substr(0, colon);
    rest.remove_prefix(colon);
    if (rest.find(':', 1) != std::string_view::npos)
      malformed(text, "an IPv6 address must be in brackets");
    if (host.empty()) malformed(text, "the host is empty");
    if (!std::all_of(host.begin(), host.end(), host_name_char))
      malformed(text, fmt::format("'{}' is not a host name or address", host));
  }
  rest.remove_prefix(1);  // ':'
  return {std::string(host), parse_port(rest, text)};
}

std::vector<MetricsScrape> scrape_metrics(const std::vector<MetricsEndpoint>& endpoints) {
  std::vector<HttpRequest> requests(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) requests[i].url = endpoints[i].url();
  const std::vector<HttpResponse> responses = http_perform(
      requests, static_cast<int>(std::max<size_t>(requests.size(), 1)), kScrapeTimeouts);
  std::vector<MetricsScrape> scrapes(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const HttpResponse& response = responses[i];
    MetricsScrape& scrape = scrapes[i];
    if (response.status == 0) {
      scrape.error = "unreachable: " + response.transport_error;
    } else if (response.status != 200) {
      scrape.error = fmt::format("answered HTTP {}", response.status);
    } else {
      try {
        scrape.samples = parse_prometheus_text(response.body);
      } catch (const Error& error) {
        scrape.error = fmt::format("answered garbage: {}", error.what());
      }
    }
  }
  return scrapes;
}

}  // namespace kiln
