// An HTTP server on 127.0.0.1 that misbehaves on purpose, to test the S3 client's retries and
// timeouts: it serves one object (HEAD and ranged GET, as S3 does) but answers request n (from 0)
// as `behaviour(n)` says: serve it, answer with an error status, hang without answering, or send
// half the body and close. One connection at a time, each closed after its answer.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace kiln::testing {

class FaultHttpServer {
 public:
  enum class Action { Serve, Status500, Status503, Hang, CloseMidBody };

  FaultHttpServer(std::string object, std::function<Action(int)> behaviour)
      : object_(std::move(object)), behaviour_(std::move(behaviour)) {
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
  ~FaultHttpServer() {
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
    const Action action = behaviour_(requests_++);
    if (action == Action::Hang) {
      while (!stopping_ && wait_readable(fd) && ::recv(fd, buffer, sizeof(buffer), 0) > 0) {
      }
      return;
    }
    if (action == Action::Status500 || action == Action::Status503) {
      const std::string body = "<Error><Code>" + std::string(action == Action::Status500 ? "InternalError" : "SlowDown") +
                               "</Code><Message>injected</Message></Error>";
      send_all(fd, std::string(action == Action::Status500 ? "HTTP/1.1 500 Internal Server Error" : "HTTP/1.1 503 Slow Down") +
                       "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
    size_t first = 0, last = object_.size() - 1;
    std::string status = "200 OK";
    if (const size_t at = request.find("range: bytes="); at != std::string::npos) {
      first = std::stoul(request.substr(at + 13));
      last = std::stoul(request.substr(request.find('-', at + 13) + 1));
      status = "206 Partial Content";
    }
    const std::string body = object_.substr(first, last - first + 1);
    const bool head = request.starts_with("HEAD");
    const std::string headers = "HTTP/1.1 " + status + "\r\nContent-Length: " +
                                std::to_string(head ? object_.size() : body.size()) +
                                "\r\nETag: \"fault\"\r\nConnection: close\r\n\r\n";
    if (head) return send_all(fd, headers);
    send_all(fd, headers + (action == Action::CloseMidBody ? body.substr(0, body.size() / 2) : body));
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

  std::string object_;
  std::function<Action(int)> behaviour_;
  int listener_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace kiln::testing
