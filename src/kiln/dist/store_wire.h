// The rendezvous store's wire format, shared by its server (store_server.cpp) and client
// (store_client.cpp) and by nothing else: length-prefixed little-endian frames over one TCP
// socket. A request is a type byte and its fields; every request gets one answer frame.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kiln::store_wire {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMaxFrame = 64u << 20;  // body bytes; bounds what one peer can make us hold
constexpr uint64_t kMaxWaitMs = 30ull * 24 * 3600 * 1000;  // keeps deadline arithmetic finite

enum Request : uint8_t { kSet = 1, kGet, kWait, kAdd, kCheck, kSetOnClose };
enum Answer : uint8_t { kOk = 1, kValue, kCount, kBool, kTimedOut, kRefused };
constexpr size_t kTimeoutOffset = 5;  // kGet and kWait carry their u64 timeout right after the type

struct BadFrame {};  // thrown by FrameReader; never leaves the store

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

inline uint32_t frame_length(const std::vector<char>& in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(in[i])) << (8 * i);
  return v;
}

inline int poll_ms(Clock::time_point deadline) {  // rounded up, so a poll never wakes just short of it
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, INT_MAX));
}

inline void set_no_delay(int fd) {  // frames are small and answered at once: Nagle would only add latency
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += fmt::format(", and {} more", keys.size() - 8);
  return out;
}

inline milliseconds bounded(milliseconds timeout) {
  return std::clamp(timeout, milliseconds(0), milliseconds(kMaxWaitMs));
}

inline std::string seconds(milliseconds ms) { return fmt::format("{:g}", ms.count() / 1000.0); }

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

}  // namespace kiln::store_wire
