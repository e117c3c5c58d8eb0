// A real S3-compatible server for tests: the npm package s3rver (installed by `make` into
// third_party/npm), started on a free 127.0.0.1 port in its own process group with one bucket and
// a throw-away data folder, stopped on destruction. s3rver checks the access key id (S3RVER) and
// the request time but not SigV4 signatures; the signer has its own tests (sigv4_test.cpp).
// available() is false (with the reason) when node or s3rver is missing, so tests can skip.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "kiln/storage/s3_client.h"
#include "kiln/storage/storage.h"
#include "kiln/dist/worker_group.h"
#include "support/loopback.h"
#include "support/temp_dir.h"

namespace kiln::testing {

class S3rver {
 public:
  static constexpr const char* kBucket = "kiln-test";

  S3rver() {
    const std::string script = std::string(KILN_NPM_DIR) + "/node_modules/s3rver/bin/s3rver.js";
    if (!std::filesystem::exists(script)) {
      reason_ = "s3rver is not installed at " + script + " (run `make test`, which installs it)";
      return;
    }
    port_ = dist::find_free_port();
    const std::string port = std::to_string(port_), data = root_ / "data", log = root_ / "s3rver.log";
    std::filesystem::create_directories(data);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::setenv("NODE_OPTIONS", "--openssl-legacy-provider", 1);  // s3rver's crypto on Node 20
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "w", stderr);
      ::execlp("node", "node", script.c_str(), "--silent", "-d", data.c_str(), "-a", "127.0.0.1", "-p", port.c_str(),
               "--configure-bucket", kBucket, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!port_accepts(port_)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        reason_ = "s3rver exited at start (is node installed?)";
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        reason_ = "s3rver did not listen within 30 s";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~S3rver() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  bool available() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Client settings for this server: its access key, quick retries.
  S3Settings settings() const {
    S3Settings settings;
    settings.endpoint = endpoint();
    settings.custom_endpoint = true;
    settings.credentials = {"S3RVER", "S3RVER", ""};
    settings.backoff_initial_ms = 10;
    settings.max_attempts = 3;
    return settings;
  }

 private:
  TempDir root_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string reason_;
};

// A fixture with one s3rver for the whole suite; its tests skip (with the reason) without one.
class S3rverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new S3rver(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!server_->available()) GTEST_SKIP() << server_->reason();
  }
  // Storage reading from this server, with an optional cache folder of small chunks.
  StorageOptions storage_options(const std::string& cache_dir, uint64_t chunk_bytes) const {
    StorageOptions options;
    options.s3 = server_->settings();
    options.cache_dir = cache_dir;
    options.cache_chunk_bytes = chunk_bytes;
    return options;
  }

  static inline S3rver* server_ = nullptr;
};

}  // namespace kiln::testing
