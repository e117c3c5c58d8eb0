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
