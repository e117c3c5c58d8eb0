// The rendezvous store: a small key-value service over TCP that lets the ranks of one job find
// each other before any collective library is up. Rank 0 serves it at MASTER_ADDR:MASTER_PORT;
// every rank (rank 0 too) talks to it through a StoreClient. It carries small blobs (NCCL's unique
// id, Gloo's pair addresses, a config hash) and counters; keys are never deleted.
//
// Wire protocol (store_wire.h): strictly request/answer frames, each a little-endian u32 body length
// (at most 64 MiB) and a body. Waits are parked on the server and answered when their keys arrive
// or when the deadline the client sent expires, so nobody spins and a timeout can name exactly
// the keys still missing. Everything the server reads is validated; a bad frame costs only the
// connection that sent it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

// Serves the store on one background thread (poll() over every connection) until destroyed.
// host "" or "0.0.0.0" listens on all IPv4 interfaces; port 0 picks a free port (tests).
// The constructor throws kiln::Error naming host:port when it cannot resolve, bind or listen.
// Destroy it only after every rank is done with the store (e.g. after a final barrier): the
// destructor closes every connection, and clients still waiting then fail with "gone".
// port() may be called from any thread.
class StoreServer {
 public:
  StoreServer(const std::string& host, int port);
  ~StoreServer();  // stops the thread, closes every socket; never throws
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;  // the bound port

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One connection to a StoreServer. Not thread-safe: one thread per StoreClient (make another
// client for another thread). Owns its socket.
//
// Timeouts: every call (connecting included) is bounded by `timeout` from the constructor, or
// by the one passed to wait(); a wait that runs out throws kiln::Error naming the address, the
// seconds and the keys still missing, e.g. "rendezvous store at 127.0.0.1:29500: timed out after
// 30 s waiting for key(s) 'rank/3' (did every rank start?)". The server itself answers a timed-out
// wait, so the connection stays usable; only when the server stops answering altogether does the
// client give up on its own, a grace of a quarter of the timeout (0.1 to 1 s) after the deadline,
// and drop the connection.
//
// Failure: a connection lost mid-call (rank 0 died) throws kiln::Error naming the address and
// saying the store (rank 0) is gone. After any error that leaves the connection out of step
// (lost, garbled, server silent) the socket is closed and the next call reconnects, with the
// same retrying as the constructor. A request (key and value) above 64 MiB throws naming the key
// before anything is sent.
class StoreClient {
 public:
  // Connects, retrying every ~100 ms until `timeout` (rank 0 may start later than the others);
  // then fails naming the address and the timeout.
  StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);  // overwrites
  // When this connection closes (its process exits or dies), the server sets `key` (to an empty
  // value): how the other ranks learn that this one is gone. A reconnect after a broken
  // connection counts as a close.
  void set_when_closed(const std::string& key);
  std::vector<char> get(const std::string& key);                     // waits until the key exists
  void wait(const std::vector<std::string>& keys);                   // waits until all exist
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Atomic across all clients; a missing key counts from 0. The value is stored as decimal
  // text (get() of a counter returns e.g. "12"); adding to a key whose value is not such text,
  // or overflowing int64, throws naming the key.
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);  // all exist now? never waits

  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const;  // "host:port"

 private:
  using Clock = std::chrono::steady_clock;
  void connect_until(Clock::time_point deadline, std::chrono::milliseconds budget);
  // Sends one request and reads its answer (of type `expected`), all within `budget` plus a grace
  // for a server that never answers; `what` names the call in errors. Returns the answer's body.
  std::vector<char> call(std::vector<char> request, uint8_t expected,
                         std::chrono::milliseconds budget, const std::string& what);
  void disconnect();

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
};

}  // namespace kiln
