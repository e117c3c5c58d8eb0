#include "kiln/dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kiln/core/error.h"

#include "kiln/dist/store_wire.h"

namespace kiln {

using namespace store_wire;

// ---- server -------------------------------------------------------------------------------

struct StoreServer::Impl {
  struct Connection {
    Socket socket;
    std::vector<char> in;   // bytes received and not yet handled
    std::vector<char> out;  // the answer being sent; requests wait until it is gone
    size_t sent = 0;
    uint8_t waiting = 0;  // kGet or kWait while parked on missing keys
    std::vector<std::string> keys;
    size_t missing = 0;
    Clock::time_point deadline;
    std::vector<std::string> on_close;  // keys set (to "") when this connection closes
    bool closed = false;
    bool busy() const { return waiting != 0 || !out.empty(); }
  };

  Socket listener, wake_read, wake_write;
  int port = 0;
  std::thread thread;
  // Touched only by the thread:
  std::unordered_map<std::string, std::vector<char>> values;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // missing key -> connections
  std::map<uint64_t, Connection> connections;
  uint64_t next_id = 0;
  std::vector<uint64_t> ready;  // connections that became idle and may hold buffered requests
  Clock::time_point accept_paused_until;

  void run_guarded() noexcept;
  void run();
  void accept_all();
  void receive(uint64_t id, Connection& c);
  void flush(uint64_t id, Connection& c);
  void answer(uint64_t id, Connection& c, std::vector<char> frame);
  void handle_buffered(uint64_t id, Connection& c);
  void handle(uint64_t id, Connection& c, FrameReader r);
  void key_arrived(const std::string& key);
  void finish_wait(uint64_t id, Connection& c);
  void unpark(uint64_t id, Connection& c);
  void close(uint64_t id, Connection& c);
  void expire_waits();
};

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.assign({{wake_read.fd(), POLLIN, 0}, {listener.fd(), POLLIN, 0}});
    ids.clear();
    auto next = Clock::time_point::max();
    if (Clock::now() < accept_paused_until) fds[1].events = 0, next = accept_paused_until;
    for (auto& [id, c] : connections) {
      fds.push_back({c.socket.fd(), short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
      if (c.waiting) next = std::min(next, c.deadline);
    }
    const int timeout = next == Clock::time_point::max() ? -1 : poll_ms(next);
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(milliseconds(10));  // ENOMEM: try again
      continue;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      Connection& c = connections.at(ids[i - 2]);
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) receive(ids[i - 2], c);
      if (!c.closed && (fds[i].revents & POLLOUT)) flush(ids[i - 2], c);
    }
    expire_waits();
    while (!ready.empty()) {
      const uint64_t id = ready.back();
      ready.pop_back();
      auto it = connections.find(id);
      if (it != connections.end() && !it->second.closed) handle_buffered(id, it->second);
    }
    std::erase_if(connections, [](const auto& entry) { return entry.second.closed; });
  }
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      set_no_delay(fd);
      connections[next_id++].socket = Socket(fd);
    } else if (errno == EINTR || errno == ECONNABORTED) {
      continue;
    } else {
      // Out of descriptors or memory: the listener stays readable, so back off instead of spinning.
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        accept_paused_until = Clock::now() + milliseconds(100);
      return;
    }
  }
}

void StoreServer::Impl::receive(uint64_t id, Connection& c) {
  char chunk[65536];
  const ssize_t n = ::recv(c.socket.fd(), chunk, sizeof chunk, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) return close(id, c);  // peer gone (possibly mid-frame) or reset
  c.in.insert(c.in.end(), chunk, chunk + n);
  // A frame may not exceed kMaxFrame; while busy a peer may buffer at most one more frame.
  if ((c.in.size() >= 4 && frame_length(c.in) > kMaxFrame) || c.in.size() > 2 * (kMaxFrame + 4)) {
    return close(id, c);
  }
  if (!c.busy()) ready.push_back(id);
}

void StoreServer::Impl::flush(uint64_t id, Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n =
        ::send(c.socket.fd(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += size_t(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;  // POLLOUT resumes it
    } else if (errno != EINTR) {
      return close(id, c);
    }
  }
  c.out.clear();
  c.sent = 0;
  if (!c.waiting) ready.push_back(id);
}

void StoreServer::Impl::answer(uint64_t id, Connection& c, std::vector<char> frame) {
  c.out = std::move(frame);
  c.sent = 0;
  flush(id, c);
}

void StoreServer::Impl::handle_buffered(uint64_t id, Connection& c) {
  while (!c.closed && !c.busy() && c.in.size() >= 4 && c.in.size() - 4 >= frame_length(c.in)) {
    const size_t end = 4 + frame_length(c.in);
    try {
      handle(id, c, FrameReader(c.in.data() + 4, end - 4));
    } catch (const BadFrame&) {
      return close(id, c);
    } catch (const std::exception&) {  // bad_alloc and the like: this peer's request only
      return close(id, c);
    }
    if (!c.closed) c.in.erase(c.in.begin(), c.in.begin() + ptrdiff_t(end));
  }
}

void StoreServer::Impl::handle(uint64_t id, Connection& c, FrameReader r) {
  const uint8_t type = r.u8();
  if (type == kSet) {
    std::string key = r.str();
    std::vector<char> value = r.bytes();
    r.end();
    const auto [it, added] = values.insert_or_assign(std::move(key), std::move(value));
    answer(id, c, FrameWriter(kOk).take());
    if (added) key_arrived(it->first);
  } else if (type == kAdd) {
    std::string key = r.str();
    const auto delta = int64_t(r.u64());
    r.end();
    const auto it = values.find(key);
    int64_t now = 0, sum = 0;
    if (it != values.end()) {
      const char* end = it->second.data() + it->second.size();
      const auto [stop, ec] = std::from_chars(it->second.data(), end, now);
      if (ec != std::errc() || stop != end) {
        const auto text = fmt::format("key '{}' holds a value that is not a counter", key);
        return answer(id, c, FrameWriter(kRefused).str(text).take());
      }
    }
    if (__builtin_add_overflow(now, delta, &sum)) {
      const auto text =
          fmt::format("adding {} to key '{}' (at {}) overflows int64", delta, key, now);
      return answer(id, c, FrameWriter(kRefused).str(text).take());
    }
    const bool added = it == values.end();
    const std::string digits = std::to_string(sum);
    values[key].assign(digits.begin(), digits.end());
    answer(id, c, FrameWriter(kCount).u64(uint64_t(sum)).take());
    if (added) key_arrived(key);
  } else if (type == kSetOnClose) {
    c.on_close.push_back(r.str());
    r.end();
    answer(id, c, FrameWriter(kOk).take());
  } else if (type == kCheck) {
    const auto keys = r.strs();
    r.end();
    const bool all =
        std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return values.contains(k); });
    answer(id, c, FrameWriter(kBool).u8(all).take());
  } else if (type == kGet || type == kWait) {
    const uint64_t timeout_ms = std::min(r.u64(), kMaxWaitMs);
    c.keys = type == kGet ? std::vector<std::string>{r.str()} : r.strs();
    r.end();
    c.waiting = type;
    c.missing = 0;
    c.deadline = Clock::now() + milliseconds(timeout_ms);
    for (const auto& key : c.keys) {
      if (!values.contains(key)) ++c.missing, waiters[key].push_back(id);
    }
    if (c.missing == 0) finish_wait(id, c);
  } else {
    throw BadFrame{};
  }
}

void StoreServer::Impl::finish_wait(uint64_t id, Connection& c) {
  const uint8_t type = c.waiting;
  const std::vector<std::string> keys = std::move(c.keys);
  c.keys.clear();
  c.waiting = 0;
  if (type == kWait) return answer(id, c, FrameWriter(kOk).take());
  const std::vector<char>& value = values.at(keys.front());
  answer(id, c, FrameWriter(kValue).blob(value.data(), value.size()).take());
}

void StoreServer::Impl::key_arrived(const std::string& key) {
  const auto it = waiters.find(key);
  if (it == waiters.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (const uint64_t id : ids) {
    const auto c = connections.find(id);
    if (c == connections.end() || c->second.closed || !c->second.waiting) continue;
    if (--c->second.missing == 0) finish_wait(id, c->second);
  }
}

void StoreServer::Impl::unpark(uint64_t id, Connection& c) {
  for (const auto& key : c.keys) {
    const auto it = waiters.find(key);
    if (it == waiters.end()) continue;
    std::erase(it->second, id);
    if (it->second.empty()) waiters.erase(it);
  }
  c.keys.clear();
  c.waiting = 0;
}

void StoreServer::Impl::close(uint64_t id, Connection& c) {
  if (c.waiting) unpark(id, c);
  c.socket.reset();
  c.in = {};
  c.out = {};
  c.closed = true;
  for (const std::string& key : std::exchange(c.on_close, {})) {
    if (values.insert_or_assign(key, std::vector<char>{}).second) key_arrived(key);
  }
}

void StoreServer::Impl::expire_waits() {
  const auto now = Clock::now();
  for (auto& [id, c] : connections) {
    if (c.closed || !c.waiting || c.deadline > now) continue;
    std::vector<std::string> missing;
    for (const auto& key : c.keys) {
      if (!values.contains(key) &&
          std::find(missing.begin(), missing.end(), key) == missing.end()) {
        missing.push_back(key);
      }
    }
    unpark(id, c);
    answer(id, c, FrameWriter(kTimedOut).strs(missing).take());
  }
}

void StoreServer::Impl::run_guarded() noexcept {
  try {
    run();
  } catch (...) {
    // Out of memory in the loop itself: close everything, so clients fail fast as "gone"
    // instead of waiting out their timeouts.
  }
  connections.clear();
  listener.reset();
}

StoreServer::StoreServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  const std::string shown = fmt::format("{}:{}", host.empty() ? "0.0.0.0" : host, port);
  KILN_CHECK(port >= 0 && port <= 65535,
             "rendezvous store: cannot listen on {}: the port is outside 0..65535", shown);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && host != "0.0.0.0") {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc != 0)
      fail("rendezvous store: cannot listen on {}: cannot resolve the host: {}", shown,
           gai_strerror(rc));
    address.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
    ::freeaddrinfo(found);
  }
  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (listener.fd() < 0 ||
      ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener.fd(), SOMAXCONN) != 0) {
    const int error = errno;
    fail("rendezvous store: cannot listen on {}: {}{}", shown, std::strerror(error),
         error == EADDRINUSE ? " (is another job using MASTER_PORT?)" : "");
  }
  sockaddr_in bound{};
  socklen_t length = sizeof bound;
  KILN_CHECK(::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&bound), &length) == 0,
             "rendezvous store: cannot listen on {}: getsockname: {}", shown, std::strerror(errno));
  impl_->port = ntohs(bound.sin_port);
  int wake[2];
  KILN_CHECK(::pipe2(wake, O_NONBLOCK | O_CLOEXEC) == 0, "rendezvous store on {}: pipe: {}", shown,
             std::strerror(errno));
  impl_->wake_read = Socket(wake[0]);
  impl_->wake_write = Socket(wake[1]);
  impl_->listener = std::move(listener);
  try {
    impl_->thread = std::thread([impl = impl_.get()] { impl->run_guarded(); });
  } catch (const std::system_error& e) {
    fail("rendezvous store on {}: cannot start its thread: {}", shown, e.what());
  }
}

StoreServer::~StoreServer() {
  const char byte = 0;
  while (::write(impl_->wake_write.fd(), &byte, 1) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
}  // Impl's sockets close here

int StoreServer::port() const { return impl_->port; }

}  // namespace kiln
