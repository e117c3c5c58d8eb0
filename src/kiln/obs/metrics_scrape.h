// Scraping the /metrics pages of running `kiln train`s (prometheus.md) for `kiln top`: where a
// page is, from what a user types, and one GET of every page at once over libcurl
// (storage/http.h, on the calling thread), parsed by prometheus_text_parser.h.
//
// A scrape never throws for what a page or the network does: an endpoint that cannot be reached,
// answers other than 200, or answers what is not Prometheus text comes back with the reason in
// `error`, so the view can show it and keep refreshing. Each GET is bounded: a second to connect,
// and the transfer is given up when it moves nothing for about a second.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/obs/prometheus_text_parser.h"

namespace kiln {

struct MetricsEndpoint {
  std::string host;  // a host name, an IPv4 address, or an IPv6 address without its brackets
  int port = 0;      // 1 to 65535

  std::string name() const;  // "127.0.0.1:9400", "[::1]:9400"
  std::string url() const;   // "http://127.0.0.1:9400/metrics"
};

// The endpoint `text` names: "PORT" (on 127.0.0.1), "HOST:PORT", "[IPV6]:PORT" (an address
// without a zone such as %eth0), or the URL `kiln train` logs, "http://HOST:PORT/metrics". Anything
// else is a kiln::Error that quotes `text` and says what is wrong.
MetricsEndpoint parse_metrics_endpoint(std::string_view text);

struct MetricsScrape {
  std::vector<PrometheusSample> samples;
  // Empty when the page was read; else why not, starting "unreachable: " (the transport's reason),
  // "answered HTTP <status>", or "answered garbage: " (the parser's message).
  std::string error;
};

// Every endpoint's page, concurrently; the answers in the endpoints' order.
std::vector<MetricsScrape> scrape_metrics(const std::vector<MetricsEndpoint>& endpoints);

}  // namespace kiln
