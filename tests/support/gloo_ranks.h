// Ranks as threads of the test process: each thread joins one Gloo group over 127.0.0.1 through
// its own store connection, for tests that must reach into each rank's objects (the training
// tests run ranks as real processes instead).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dist/gloo_communicator.h"
#include "kiln/dist/store.h"

namespace kiln::testing {

// Runs body(communicator) on `ranks` threads; a rank's exception becomes a test failure naming it.
inline void on_gloo_ranks(int ranks, const std::function<void(GlooCommunicator&)>& body) {
  using namespace std::chrono_literals;
  StoreServer server("127.0.0.1", 0);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(static_cast<size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        StoreClient store("127.0.0.1", server.port(), 30s);
        GlooCommunicator communicator(rank, ranks, store, {"127.0.0.1", ""}, 30s);
        body(communicator);
      } catch (const std::exception& error) {
        failures[static_cast<size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < ranks; ++rank) EXPECT_EQ(failures[static_cast<size_t>(rank)], "") << "rank " << rank;
}

}  // namespace kiln::testing
