#include "kiln/dist/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "kiln/dist/worker_group.h"
#include "support/error_of.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;
using testing::error_of;
using Clock = std::chrono::steady_clock;

std::vector<char> bytes(std::string_view text) { return {text.begin(), text.end()}; }

std::string address_of(int port) { return "127.0.0.1:" + std::to_string(port); }

// A raw connection that speaks whatever bytes a test gives it.
class RawPeer {
 public:
  explicit RawPeer(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(uint16_t(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const timeval limit{2, 0};  // a server that never answers fails the test instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  }
  ~RawPeer() { ::close(fd_); }
  void send(const std::string& data) {
    EXPECT_EQ(::send(fd_, data.data(), data.size(), MSG_NOSIGNAL), ssize_t(data.size()));
  }
  void shut_down_writing() { ::shutdown(fd_, SHUT_WR); }
  std::string receive(size_t size) {  // exactly `size` bytes, or what came before a close
    std::string data(size, '\0');
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::recv(fd_, data.data() + done, size - done, 0);
      if (n <= 0) break;
      done += size_t(n);
    }
    return data.substr(0, done);
  }
  // True when the server closed the connection within `timeout`.
  bool dropped_by_server(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(timeout.count())) != 1) return false;
    char byte;
    return ::recv(fd_, &byte, 1, 0) <= 0;
  }

 private:
  int fd_;
};

// A frame as the store's wire protocol lays it out: u32 little-endian length, then the body.
std::string frame(const std::string& body) {
  const auto n = uint32_t(body.size());
  return std::string{char(n), char(n >> 8), char(n >> 16), char(n >> 24)} + body;
}

TEST(Store, SetGetRoundTripsBinaryValues) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(client.address(), address_of(server.port()));
  EXPECT_EQ(client.timeout(), 2s);
  const std::vector<char> blob = {'n', '\0', 'c', '\xff', '\0', '\x01'};
  client.set("nccl/unique_id", blob);
  client.set("empty", {});
  EXPECT_EQ(client.get("nccl/unique_id"), blob);
  EXPECT_EQ(client.get("empty"), std::vector<char>{});
  StoreClient other("localhost", server.port(), 2s);  // a host name, resolved
  EXPECT_EQ(other.get("nccl/unique_id"), blob);
}

TEST(Store, SetOverwrites) {
  StoreServer server("", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  client.set("config", bytes("first"));
  client.set("config", bytes("second, longer"));
  EXPECT_EQ(client.get("config"), bytes("second, longer"));
}

TEST(Store, AKeyRegisteredForACloseIsSetWhenItsConnectionCloses) {
  StoreServer server("127.0.0.1", 0);
  StoreClient watcher("127.0.0.1", server.port(), 2s);
  {
    StoreClient rank("127.0.0.1", server.port(), 2s);
    rank.set_when_closed("gone/1");
    rank.set("rank/1", bytes("here"));
    EXPECT_FALSE(watcher.check({"gone/1"}));
  }  // the rank's process "dies": its connection closes
  watcher.wait({"gone/1"}, 2000ms);
  EXPECT_EQ(watcher.get("gone/1"), bytes(""));
}

TEST(Store, GetWaitsForAKeyAnotherRankSetsLater) {
  StoreServer server("127.0.0.1", 0);
  std::thread setter([port = server.port()] {
    StoreClient client("127.0.0.1", port, 2s);
    std::this_thread::sleep_for(100ms);
    client.set("rank/1", bytes("10.0.0.2:4000"));
  });
  StoreClient client("127.0.0.1", server.port(), 2s);
  const auto start = Clock::now();
  EXPECT_EQ(client.get("rank/1"), bytes("10.0.0.2:4000"));
  EXPECT_GE(Clock::now() - start, 80ms);
  setter.join();
}

TEST(Store, WaitReturnsOnceEveryKeyExists) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  client.set("a", bytes("1"));
  std::thread setter([port = server.port()] {
    StoreClient client("127.0.0.1", port, 2s);
    std::this_thread::sleep_for(30ms);
    client.set("b", bytes("2"));
    std::this_thread::sleep_for(30ms);
    client.set("c", bytes("3"));
  });
  EXPECT_FALSE(client.check({"a", "b", "c"}));
  client.wait({"a", "b", "c", "b"});
  EXPECT_TRUE(client.check({"c"}));
  EXPECT_TRUE(client.check({"a", "b", "c"}));
  setter.join();
}

TEST(Store, CheckNeverWaits) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  EXPECT_TRUE(client.check({}));
  EXPECT_FALSE(client.check({"x"}));
  client.set("x", bytes("1"));
  EXPECT_TRUE(client.check({"x"}));
  EXPECT_FALSE(client.check({"x", "y"}));
}

TEST(Store, AddFromManyClientsReachesTheExactTotal) {
  StoreServer server("127.0.0.1", 0);
  constexpr int kThreads = 4, kAdds = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([port = server.port()] {
      StoreClient client("127.0.0.1", port, 2s);
      for (int i = 0; i < kAdds; ++i) client.add("arrived", 1);
    });
  }
  for (auto& thread : threads) thread.join();
  StoreClient client("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(client.add("arrived", 0), kThreads * kAdds);
  EXPECT_EQ(client.get("arrived"), bytes("800"));  // counters read back as decimal text
  EXPECT_EQ(client.add("fresh", -5), -5);
  EXPECT_EQ(client.add("fresh", 7), 2);
}

TEST(Store, AddToANonCounterNamesTheKeyAndKeepsTheConnection) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  client.set("name", bytes("gpt"));
  EXPECT_EQ(error_of([&] { client.add("name", 1); }),
            "rendezvous store at " + address_of(server.port()) +
                ": key 'name' holds a value that is not a counter");
  client.add("big", INT64_MAX);
  EXPECT_NE(error_of([&] { client.add("big", 1); }).find("overflows int64"), std::string::npos);
  EXPECT_EQ(client.get("name"), bytes("gpt"));
}

TEST(Store, TimeoutNamesTheMissingKeysAndKeepsTheConnection) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 200ms);
  client.set("rank/0", bytes("here"));
  const auto start = Clock::now();
  EXPECT_EQ(error_of([&] {
              client.wait({"rank/0", "rank/3"});
            }),
            "rendezvous store at " + address_of(server.port()) +
                ": timed out after 0.2 s waiting for key(s) 'rank/3' (did every rank start?)");
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 800ms);
  EXPECT_EQ(error_of([&] { client.wait({"x"}, 50ms); }),
            "rendezvous store at " + address_of(server.port()) +
                ": timed out after 0.05 s waiting for key(s) 'x' (did every rank start?)");
  EXPECT_EQ(client.get("rank/0"), bytes("here"));
}

TEST(Store, ManyMissingKeysAreNamedUpToEight) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  std::vector<std::string> keys;
  for (int rank = 0; rank < 10; ++rank) keys.push_back("rank/" + std::to_string(rank));
  client.set("rank/0", bytes(""));
  EXPECT_EQ(error_of([&] { client.wait(keys, 20ms); }),
            "rendezvous store at " + address_of(server.port()) +
                ": timed out after 0.02 s waiting for key(s) 'rank/1', 'rank/2', 'rank/3', "
                "'rank/4', 'rank/5', "
                "'rank/6', 'rank/7', 'rank/8', and 1 more (did every rank start?)");
}

TEST(Store, LargeValuesRoundTrip) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 5s);
  std::vector<char> large(1 << 20);  // beyond the initial socket buffers: partial sends both ways
  for (size_t i = 0; i < large.size(); ++i) large[i] = char(i * 2654435761u >> 24);
  client.set("large", large);
  EXPECT_EQ(client.get("large"), large);
}

TEST(Store, ASilentServerTimesOutOnTheClientSide) {
  // A listening socket nobody accepts from: the kernel completes the connection, nobody answers.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  StoreClient client("127.0.0.1", port, 40ms);
  const auto start = Clock::now();
  EXPECT_EQ(
      error_of([&] { client.set("k", bytes("v")); }),
      "rendezvous store at " + address_of(port) +
          ": timed out after 0.04 s setting key 'k' (the store did not answer: is rank 0 stuck?)");
  EXPECT_LT(Clock::now() - start, 1s);
  ::close(fd);
}

TEST(Store, ClientConnectingBeforeTheServerRetries) {
  const int port = dist::find_free_port();
  std::unique_ptr<StoreServer> server;
  std::string server_error;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server_error = error_of([&] { server = std::make_unique<StoreServer>("127.0.0.1", port); });
  });
  const auto start = Clock::now();
  std::unique_ptr<StoreClient> client;
  const std::string client_error =
      error_of([&] { client = std::make_unique<StoreClient>("127.0.0.1", port, 3s); });
  const auto waited = Clock::now() - start;
  starter.join();
  ASSERT_EQ(server_error, "");
  ASSERT_EQ(client_error, "");
  EXPECT_GE(waited, 250ms);
  client->set("late", bytes("yes"));
  EXPECT_EQ(client->get("late"), bytes("yes"));
}

TEST(Store, ConnectingToNobodyFailsNamingAddressAndTimeout) {
  const int port = dist::find_free_port();
  const std::string error = error_of([&] { StoreClient("127.0.0.1", port, 100ms); });
  EXPECT_EQ(
      error.rfind("rendezvous store at " + address_of(port) + ": could not connect within 0.1 s: ",
                  0),
      0u)
      << error;
}

TEST(Store, ServerGoneWhileWaitingIsReportedAtOnce) {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0);
  const int port = server->port();
  StoreClient client("127.0.0.1", port, 10s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  const auto start = Clock::now();
  EXPECT_EQ(error_of([&] { client.get("never"); }),
            "rendezvous store at " + address_of(port) +
                ": connection lost while waiting for key(s) 'never': the store (rank 0) is gone");
  EXPECT_LT(Clock::now() - start, 2s);
  stopper.join();
}

TEST(Store, GarbageFromOnePeerOnlyDropsThatPeer) {
  StoreServer server("127.0.0.1", 0);
  StoreClient client("127.0.0.1", server.port(), 2s);
  client.set("before", bytes("1"));

  RawPeer oversized(server.port());
  oversized.send(std::string("\xff\xff\xff\x7f", 4));  // ~2 GiB declared: refused before reading
  EXPECT_TRUE(oversized.dropped_by_server(1s));

  RawPeer unknown_type(server.port());
  unknown_type.send(frame("\x63junk"));
  EXPECT_TRUE(unknown_type.dropped_by_server(1s));

  RawPeer lying_length(server.port());  // a set whose key claims 1000 bytes but has 3
  lying_length.send(frame(std::string("\x01\xe8\x03\x00\x00key", 8)));
  EXPECT_TRUE(lying_length.dropped_by_server(1s));

  RawPeer huge_count(server.port());  // a check of 2^32-1 keys in a 5-byte body
  huge_count.send(frame(std::string("\x05\xff\xff\xff\xff", 5)));
  EXPECT_TRUE(huge_count.dropped_by_server(1s));

  RawPeer half_frame(server.port());
  half_frame.send(std::string("\x40\x00\x00\x00\x01", 5));  // promises 64 bytes, sends 1
  half_frame.shut_down_writing();
  EXPECT_TRUE(half_frame.dropped_by_server(1s));

  {  // a well-formed wait for "k" (10 s), then the peer leaves: the server forgets the waiter
    RawPeer leaver(server.port());
    leaver.send(frame(
        std::string("\x03\x10\x27\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00k", 18)));
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(10ms);
  client.set("k", bytes("arrived after the waiter left"));

  RawPeer speaks_the_protocol(
      server.port());  // a get of "before" by hand: the answer is a value "1"
  speaks_the_protocol.send(
      frame(std::string("\x02\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00"
                        "before",
                        19)));
  EXPECT_EQ(speaks_the_protocol.receive(10), frame(std::string("\x02\x01\x00\x00\x00"
                                                               "1",
                                                               6)));

  client.set("after", bytes("2"));
  EXPECT_EQ(client.get("before"), bytes("1"));
  EXPECT_TRUE(client.check({"after"}));
  StoreClient newcomer("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(newcomer.get("after"), bytes("2"));
}

int open_descriptors() {
  return int(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                           std::filesystem::directory_iterator()));
}

TEST(Store, EverySocketClosesWithItsOwner) {
  const int before = open_descriptors();
  {
    StoreServer server("127.0.0.1", 0);
    StoreClient a("127.0.0.1", server.port(), 2s), b("127.0.0.1", server.port(), 2s);
    a.set("k", bytes("v"));
    EXPECT_EQ(b.get("k"), bytes("v"));
    EXPECT_NE(error_of([&] { b.wait({"never"}, 10ms); }), "");
  }
  EXPECT_EQ(open_descriptors(), before);
}

TEST(Store, BindErrorNamesThePort) {
  StoreServer first("", 0);
  EXPECT_EQ(error_of([&] { StoreServer second("0.0.0.0", first.port()); }),
            "rendezvous store: cannot listen on 0.0.0.0:" + std::to_string(first.port()) +
                ": Address already in use (is another job using MASTER_PORT?)");
  EXPECT_EQ(error_of([] { StoreServer bad("", 70000); }),
            "rendezvous store: cannot listen on 0.0.0.0:70000: the port is outside 0..65535");
}

}  // namespace
}  // namespace kiln
