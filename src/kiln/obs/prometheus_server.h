// PrometheusServer: answers `GET /metrics` (and HEAD) over HTTP with the text a callback renders,
// as `text/plain; version=0.0.4`, the content type of Prometheus's text exposition format; any
// other path is 404 and any other method 405. The HTTP is libmicrohttpd's (Debian's
// libmicrohttpd-dev), on its own thread; kiln parses no HTTP itself.
//
// The constructor binds and listens on `address:port` itself (numeric IPv4 or IPv6, or a host
// name), so a port in use or an address not of this host is a kiln::Error naming both, with the
// system's reason, before anything else happens. Port 0 takes a free port; port() says which.
//
// The callback runs on the server's thread, one request at a time; it must be thread-safe against
// whatever updates what it renders. An exception from it answers 500 with its message.
// Destruction stops the thread after the request in flight, if any.
#pragma once

#include <functional>
#include <string>

struct MHD_Daemon;

namespace kiln {

class PrometheusServer {
 public:
  using Render = std::function<std::string()>;

  PrometheusServer(const std::string& address, int port, Render render);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  int port() const { return port_; }
  std::string url() const;  // http://address:port/metrics

 private:
  std::string address_;
  int port_ = 0;
  Render render_;
  MHD_Daemon* daemon_ = nullptr;
};

}  // namespace kiln
