#include "kiln/obs/prometheus_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>

#include "kiln/core/error.h"

namespace kiln {
namespace {

// The content type of the text exposition format 0.0.4
// (prometheus.io/docs/instrumenting/exposition_formats/).
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string host_and_port(const std::string& address, int port) {
  return address.find(':') != std::string::npos ? fmt::format("[{}]:{}", address, port)
                                                : fmt::format("{}:{}", address, port);
}

// A TCP socket listening on address:port; a kiln::Error naming both, with the reason, otherwise.
int listen_on(const std::string& address, int port) {
  KILN_CHECK(port >= 0 && port <= 65535, "Prometheus endpoint: port {} is not in [0, 65535]", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int error =
          ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found);
      error != 0)
    fail(
        "Prometheus endpoint: cannot listen on {}: the address '{}' (--metrics-addr) is not known: "
        "{}",
        host_and_port(address, port), address, ::gai_strerror(error));
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  KILN_CHECK(fd >= 0, "Prometheus endpoint: cannot listen on {}: socket: {}",
             host_and_port(address, port), std::strerror(errno));
  // A restarted run may rebind while the last one's connections linger in TIME_WAIT; a port that
  // another socket listens on stays refused.
  const int reuse = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    fail("Prometheus endpoint: cannot listen on {}: {}{}", host_and_port(address, port),
         std::strerror(error),
         error == EADDRINUSE
             ? " (another process has the port; each rank serves --metrics-port + its local rank)"
             : "");
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  KILN_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0,
             "Prometheus endpoint: getsockname: {}", std::strerror(errno));
  const uint16_t port = address.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6&>(address).sin6_port
                            : reinterpret_cast<sockaddr_in&>(address).sin_port;
  return ntohs(port);
}

// libmicrohttpd's access handler (MHD_AccessHandlerCallback): the whole answer on its first call,
// since a GET has no body to wait for.
MHD_Result answer(void* render_function, MHD_Connection* connection, const char* url,
                  const char* method, const char* /*version*/, const char* /*upload_data*/,
                  size_t* /*upload_data_size*/, void** /*request_state*/) {
  unsigned status = MHD_HTTP_OK;
  std::string body;
  const bool get_or_head = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                           std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!get_or_head) {
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = "kiln's metrics endpoint answers GET\n";
  } else if (std::strcmp(url, "/metrics") != 0) {
    status = MHD_HTTP_NOT_FOUND;
    body = "kiln serves its metrics at /metrics\n";
  } else {
    try {
      body = (*static_cast<const PrometheusServer::Render*>(render_function))();
    } catch (const std::exception& error) {
      status = MHD_HTTP_INTERNAL_SERVER_ERROR;
      body = fmt::format("kiln could not render its metrics: {}\n", error.what());
    }
  }
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: libmicrohttpd closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                          status == MHD_HTTP_OK ? kContentType : "text/plain; charset=utf-8");
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

PrometheusServer::PrometheusServer(const std::string& address, int port, Render render)
    : address_(address), render_(std::move(render)) {
  const int fd = listen_on(address, port);
  port_ = bound_port(fd);
  // From here libmicrohttpd owns the socket: MHD_stop_daemon closes it, and so do its failure paths
  // after reading the options (libmicrohttpd 0.9.75, src/microhttpd/daemon.c).
  daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, nullptr, nullptr,
                             &answer, &render_, MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_TIMEOUT, 10U, MHD_OPTION_END);
  KILN_CHECK(daemon_ != nullptr,
             "Prometheus endpoint on {}: libmicrohttpd could not start its server thread",
             host_and_port(address, port_));
}

PrometheusServer::~PrometheusServer() { MHD_stop_daemon(daemon_); }

std::string PrometheusServer::url() const {
  return fmt::format("http://{}/metrics", host_and_port(address_, port_));
}

}  // namespace kiln
