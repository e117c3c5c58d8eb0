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

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMaxFrame = 64u << 20;  // body bytes; bounds what one peer can make us hold
constexpr uint64_t kMaxWaitMs = 30ull * 24 * 3600 * 1000;  // keeps deadline arithmetic finite

enum Request : uint8_t { kSet = 1, kGet, kWait, kAdd, kCheck, kSetOnClose };
enum Answer : uint8_t { kOk = 1, kValue, kCount, kBool, kTimedOut, kRefused };
constexpr size_t kTimeoutOffset = 5;  // kGet and kWait carry their u64 timeout right after the type

struct BadFrame {};  // thrown by FrameReader; never leaves this file

// A frame being built: u32 body length (filled by take()), then the body.
class FrameWriter {
 public:
  explicit FrameWriter(uint8_t type) : bytes_(4) { u8(type); }
  FrameWriter& u8(uint8_t v) { return uint(v, 1); }
  FrameWriter& u32(uint32_t v) { return uint(v, 4); }
  FrameWriter& u64(uint64_t v) { return uint(v, 8); }
  FrameWriter& blob(const char* data, size_t size) { return u32(uint32_t(size)).raw(data, size); }
  FrameWriter& str(const std::string& s) { return blob(s.data(), s.size()); }
  FrameWriter& strs(const std::vector<std::string>& list) {
    u32(uint32_t(list.size()));
    for (const auto& s : list) str(s);
    return *this;
  }
  std::vector<char> take() {  // leaves the writer empty; the sender refuses frames over kMaxFrame
    const uint64_t body = bytes_.size() - 4;
    for (int i = 0; i < 4; ++i) bytes_[i] = char(body >> (8 * i));
    return std::move(bytes_);
  }

 private:
  FrameWriter& raw(const void* data, size_t size) {
    bytes_.insert(bytes_.end(), static_cast<const char*>(data),
                  static_cast<const char*>(data) + size);
    return *this;
  }
  FrameWriter& uint(uint64_t v, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(char(v >> (8 * i)));
    return *this;
  }
  std::vector<char> bytes_;
};

// Reads a frame body, checking every length against what is left; throws BadFrame.
class FrameReader {
 public:
  FrameReader(const char* data, size_t size) : p_(data), left_(size) {}
  uint8_t u8() { return uint8_t(uint(1)); }
  uint32_t u32() { return uint32_t(uint(4)); }
  uint64_t u64() { return uint(8); }
  std::string str() {
    const auto [data, size] = blob();
    return {data, size};
  }
  std::vector<char> bytes() {
    const auto [data, size] = blob();
    return {data, data + size};
  }
  std::vector<std::string> strs() {
    const uint32_t count = u32();
    if (count > left_ / 4) throw BadFrame{};  // each entry needs at least its length
    std::vector<std::string> list(count);
    for (auto& s : list) s = str();
    return list;
  }
  void end() const {
    if (left_ != 0) throw BadFrame{};
  }

 private:
  std::pair<const char*, size_t> blob() {
    const uint32_t size = u32();
    if (size > left_) throw BadFrame{};
    const char* data = p_;
    p_ += size, left_ -= size;
    return {data, size};
  }
  uint64_t uint(size_t width) {
    if (left_ < width) throw BadFrame{};
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v |= uint64_t(uint8_t(p_[i])) << (8 * i);
    p_ += width, left_ -= width;
    return v;
  }
  const char* p_;
  size_t left_;
};

uint32_t frame_length(const std::vector<char>& in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(in[i])) << (8 * i);
  return v;
}

int poll_ms(Clock::time_point deadline) {  // rounded up, so a poll never wakes just short of it
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, INT_MAX));
}

void set_no_delay(int fd) {  // frames are small and answered at once: Nagle would only add latency
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += fmt::format(", and {} more", keys.size() - 8);
  return out;
}

milliseconds bounded(milliseconds timeout) {
  return std::clamp(timeout, milliseconds(0), milliseconds(kMaxWaitMs));
}

std::string seconds(milliseconds ms) { return fmt::format("{:g}", ms.count() / 1000.0); }

class Socket {  // owns one descriptor
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Socket() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  int fd() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

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

// ---- client -------------------------------------------------------------------------------

namespace {

// Waits until `fd` is ready for `events` or `deadline` passes (false).
bool ready(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  int n;
  do n = ::poll(&p, 1, poll_ms(deadline));
  while (n < 0 && errno == EINTR);
  return n != 0;  // errors and hang-ups count as ready: the next send/recv reports them
}

// One connection attempt: the descriptor, or -1 with `error` saying why.
int connect_once(const std::string& host, int port, Clock::time_point deadline,
                 std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    error = fmt::format("cannot resolve the host: {}", gai_strerror(rc));
    return -1;
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int status = s.fd() < 0 ? errno : 0;
  if (status == 0 && ::connect(s.fd(), found->ai_addr, found->ai_addrlen) != 0) {
    status = errno;
    if (status == EINPROGRESS) {
      socklen_t length = sizeof status;
      if (!ready(s.fd(), POLLOUT, deadline))
        status = ETIMEDOUT;
      else if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &status, &length) != 0)
        status = errno;
    }
  }
  // On loopback, connecting to a free port in the ephemeral range can join the socket to itself
  // (TCP simultaneous open); that is nobody listening.
  sockaddr_in self{}, peer{};
  socklen_t self_length = sizeof self, peer_length = sizeof peer;
  if (status == 0 && ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&self), &self_length) == 0 &&
      ::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0 &&
      self.sin_port == peer.sin_port && self.sin_addr.s_addr == peer.sin_addr.s_addr) {
    status = ECONNREFUSED;
  }
  if (status != 0) {
    error = std::strerror(status);
    return -1;
  }
  set_no_delay(s.fd());
  return s.release();
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, milliseconds timeout)
    : host_(host), port_(port), timeout_(bounded(timeout)) {
  KILN_CHECK(port > 0 && port <= 65535, "rendezvous store at {}: the port is outside 1..65535",
             address());
  connect_until(Clock::now() + timeout_, timeout_);
}

StoreClient::~StoreClient() { disconnect(); }

void StoreClient::disconnect() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

std::string StoreClient::address() const { return fmt::format("{}:{}", host_, port_); }

void StoreClient::connect_until(Clock::time_point deadline, milliseconds budget) {
  std::string error;
  for (;;) {
    fd_ = connect_once(host_, port_, deadline, error);
    if (fd_ >= 0) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      fail("rendezvous store at {}: could not connect within {} s: {} {}", address(),
           seconds(budget), error,
           "(is rank 0 running, and are MASTER_ADDR and MASTER_PORT right?)");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(100), deadline - now));
  }
}

std::vector<char> StoreClient::call(std::vector<char> request, uint8_t expected,
                                    milliseconds budget, const std::string& what) {
  KILN_CHECK(request.size() - 4 <= kMaxFrame,
             "rendezvous store at {}: {} needs a {}-byte request, above the store's 64 MiB limit",
             address(), what, request.size());
  const auto deadline = Clock::now() + budget;
  if (fd_ < 0) connect_until(deadline, budget);
  if (request[4] == kGet || request[4] == kWait) {  // the server times waits out: send what is left
    const auto left = uint64_t(std::max<int64_t>(0, poll_ms(deadline)));
    for (int i = 0; i < 8; ++i) request[kTimeoutOffset + i] = char(left >> (8 * i));
  }
  const auto lost = [&] {
    disconnect();
    fail("rendezvous store at {}: connection lost while {}: the store (rank 0) is gone", address(),
         what);
  };
  const auto silent = [&] {
    disconnect();
    fail("rendezvous store at {}: timed out after {} s {} {}", address(), seconds(budget), what,
         "(the store did not answer: is rank 0 stuck?)");
  };
  const auto malformed = [&] {
    disconnect();
    fail("rendezvous store at {}: malformed answer while {} (is another service on MASTER_PORT?)",
         address(), what);
  };
  // The server answers a timed-out wait itself; the client gives up alone only on a silent server,
  // after a grace that covers the answer's trip.
  const auto give_up = deadline + std::clamp(budget / 4, milliseconds(100), milliseconds(1000));
  for (size_t done = 0; done < request.size();) {
    const ssize_t n = ::send(fd_, request.data() + done, request.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += size_t(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!ready(fd_, POLLOUT, give_up)) silent();
    } else if (errno != EINTR) {
      lost();
    }
  }
  std::vector<char> body(4);
  for (size_t done = 0; done < body.size();) {
    const ssize_t n = ::recv(fd_, body.data() + done, body.size() - done, 0);
    if (n > 0) {
      done += size_t(n);
      if (done == 4 && body.size() == 4) {  // the header is in: now the body
        const uint32_t length = frame_length(body);
        if (length == 0 || length > kMaxFrame) malformed();
        body.assign(length, 0);
        done = 0;
      }
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      lost();
    } else if (!ready(fd_, POLLIN, give_up)) {
      silent();
    }
  }
  try {
    FrameReader r(body.data(), body.size());
    const uint8_t type = r.u8();
    if (type == kTimedOut) {
      const auto missing = r.strs();
      fail("rendezvous store at {}: timed out after {} s waiting for key(s) {} {}", address(),
           seconds(budget), quote_keys(missing), "(did every rank start?)");
    }
    if (type == kRefused) fail("rendezvous store at {}: {}", address(), r.str());
    if (type != expected) malformed();
    if (type == kValue) r.bytes();
    if (type == kCount) r.u64();
    if (type == kBool) r.u8();
    r.end();
  } catch (const BadFrame&) {
    malformed();
  }
  return body;
}

void StoreClient::set_when_closed(const std::string& key) {
  call(FrameWriter(kSetOnClose).str(key).take(), kOk, timeout_, fmt::format("registering key '{}'", key));
}

void StoreClient::set(const std::string& key, const std::vector<char>& value) {
  const std::string what = fmt::format("setting key '{}'", key);
  const size_t body = 1 + 4 + key.size() + 4 + value.size();  // checked before copying a huge value
  KILN_CHECK(body <= kMaxFrame,
             "rendezvous store at {}: {} needs a {}-byte request, above the store's 64 MiB limit",
             address(), what, 4 + body);
  call(FrameWriter(kSet).str(key).blob(value.data(), value.size()).take(), kOk, timeout_, what);
}

std::vector<char> StoreClient::get(const std::string& key) {
  const auto body = call(FrameWriter(kGet).u64(0).str(key).take(), kValue, timeout_,
                         fmt::format("waiting for key(s) '{}'", key));
  return FrameReader(body.data() + 1, body.size() - 1).bytes();
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  call(FrameWriter(kWait).u64(0).strs(keys).take(), kOk, bounded(timeout),
       "waiting for key(s) " + quote_keys(keys));
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  const auto body = call(FrameWriter(kAdd).str(key).u64(uint64_t(delta)).take(), kCount, timeout_,
                         fmt::format("adding to key '{}'", key));
  return int64_t(FrameReader(body.data() + 1, body.size() - 1).u64());
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  const auto body = call(FrameWriter(kCheck).strs(keys).take(), kBool, timeout_,
                         "checking key(s) " + quote_keys(keys));
  return FrameReader(body.data() + 1, body.size() - 1).u8() != 0;
}

}  // namespace kiln
