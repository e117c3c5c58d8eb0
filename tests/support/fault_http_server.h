// HTTP servers on 127.0.0.1 that misbehave on purpose, to test the S3 client's retries, timeouts
// and its checks of what an endpoint answers. One connection at a time, each closed after its
// answer.
//
// ScriptedHttpServer answers request n (from 0) with the raw bytes `respond(n, request)` returns
// (status line, headers and body, as sent), or hangs without answering when it returns nullopt.
// FaultHttpServer serves one object (HEAD and ranged GET, as S3 does) but answers request n as
// `behaviour(n)` says: serve it, answer with an error status, hang, or send half the body and close.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "kiln/storage/s3_client.h"

namespace kiln::testing {

class ScriptedHttpServer {
 public:
  using Respond = std::function<std::optional<std::string>(int n, const std::string& request)>;

  explicit ScriptedHttpServer(Respond respond) : respond_(std::move(respond)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    ::listen(listener_, 16);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedHttpServer() {
    stopping_ = true;
    thread_.join();
    ::close(listener_);
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  bool wait_readable(int fd) {
    pollfd entry{fd, POLLIN, 0};
    while (!stopping_)
      if (::poll(&entry, 1, 50) > 0) return true;
    return false;
  }

  void send_all(int fd, const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t sent = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (sent <= 0) return;
      done += static_cast<size_t>(sent);
    }
  }

  void answer(int fd) {
    std::string request;
    char buffer[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      if (!wait_readable(fd)) return;
      const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) return;
      request.append(buffer, static_cast<size_t>(got));
    }
    const std::optional<std::string> response = respond_(requests_++, request);
    if (response) return send_all(fd, *response);
    while (!stopping_ && wait_readable(fd) && ::recv(fd, buffer, sizeof(buffer), 0) > 0) {
    }
  }

  void serve() {
    while (!stopping_) {
      if (!wait_readable(listener_)) break;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      answer(fd);
      ::close(fd);
    }
  }

  Respond respond_;
  int listener_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

// An HTTP answer with `status` ("200 OK"), the given extra header lines and `body`, its
// Content-Length stated unless `headers` states one.
inline std::string http_answer(const std::string& status, const std::string& headers, const std::string& body) {
  const bool has_length = headers.find("Content-Length:") != std::string::npos;
  return "HTTP/1.1 " + status + "\r\n" + headers +
         (has_length ? "" : "Content-Length: " + std::to_string(body.size()) + "\r\n") + "Connection: close\r\n\r\n" +
         body;
}

class FaultHttpServer {
 public:
  enum class Action { Serve, Status500, Status503, Hang, CloseMidBody };

  FaultHttpServer(std::string object, std::function<Action(int)> behaviour)
      : object_(std::move(object)),
        behaviour_(std::move(behaviour)),
        server_([this](int n, const std::string& request) { return respond(n, request); }) {}

  std::string endpoint() const { return server_.endpoint(); }
  int requests() const { return server_.requests(); }

 private:
  std::optional<std::string> respond(int n, const std::string& request) const {
    const Action action = behaviour_(n);
    if (action == Action::Hang) return std::nullopt;
    if (action == Action::Status500 || action == Action::Status503) {
      const bool internal = action == Action::Status500;
      return http_answer(internal ? "500 Internal Server Error" : "503 Slow Down", "",
                         "<Error><Code>" + std::string(internal ? "InternalError" : "SlowDown") +
                             "</Code><Message>injected</Message></Error>");
    }
    size_t first = 0, last = object_.size() - 1;
    std::string status = "200 OK";
    if (const size_t at = request.find("range: bytes="); at != std::string::npos) {
      first = std::stoul(request.substr(at + 13));
      last = std::stoul(request.substr(request.find('-', at + 13) + 1));
      status = "206 Partial Content";
    }
    const std::string body = object_.substr(first, last - first + 1);
    const std::string range = status.starts_with("206") ? "Content-Range: bytes " + std::to_string(first) + "-" +
                                                              std::to_string(last) + "/" +
                                                              std::to_string(object_.size()) + "\r\n"
                                                        : "";
    if (request.starts_with("HEAD"))
      return http_answer(status, "Content-Length: " + std::to_string(object_.size()) + "\r\nETag: \"fault\"\r\n", "");
    const std::string headers = "Content-Length: " + std::to_string(body.size()) + "\r\nETag: \"fault\"\r\n" + range;
    return http_answer(status, headers, action == Action::CloseMidBody ? body.substr(0, body.size() / 2) : body);
  }

  std::string object_;
  std::function<Action(int)> behaviour_;
  ScriptedHttpServer server_;  // last: its thread starts once the members it reads exist
};

// S3 client settings for one of these servers: quick retries (4 attempts), a 1 s stall timeout.
inline S3Settings s3_settings_for(const std::string& endpoint) {
  S3Settings settings;
  settings.endpoint = endpoint;
  settings.custom_endpoint = true;
  settings.credentials = {"id", "secret", ""};
  settings.backoff_initial_ms = 5;
  settings.max_attempts = 4;
  settings.timeouts.stall_seconds = 1;
  return settings;
}

}  // namespace kiln::testing
