// ProcessGroup: what one rank holds to take part in a distributed run: the rendezvous store
// (served by rank 0 at MASTER_ADDR:MASTER_PORT, store.h), this rank's connection to it, and the
// Communicator of the chosen engine. join_process_group() is the only way in.
//
// Joining: rank 0 starts the store; every rank connects (retrying until the timeout, so the ranks
// may start in any order), the ranks check that they run one configuration
// (check_same_configuration), then the engine connects its ranks through the store. Every wait is
// bounded by `timeout`; a rank that never comes is named by the store's error.
// Ownership: the group owns all three; destroy the Communicator's users first.
// After a collective failed through a peer fault, rank 0's group keeps serving the store while it
// is destroyed, for up
// to the failure's grace (lost_rank_grace), until every other rank has failed too or is gone: the
// later ranks can then still tell who is to blame instead of finding the store, and so rank 0,
// gone.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "kiln/dist/bootstrap.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/gloo_communicator.h"
#include "kiln/dist/store.h"

namespace kiln {

struct ProcessGroup {
  ProcessPlace place;
  std::unique_ptr<StoreServer> server;  // rank 0 only
  std::unique_ptr<StoreClient> store;
  std::unique_ptr<Communicator> communicator;
  std::chrono::milliseconds failure_grace{0};  // lost_rank_grace of the group's timeout
  std::atomic<bool> collective_failed{false};  // through a peer fault (set by the failure explainer)
  ~ProcessGroup();
};

// `backend`: "gloo" (CPU ranks) or "nccl" (GPU ranks); `config_yaml`: this rank's resolved
// configuration.
std::unique_ptr<ProcessGroup> join_process_group(const ProcessPlace& place, const std::string& backend,
                                                 std::chrono::milliseconds timeout, const std::string& config_yaml);

// Every rank posts its resolved configuration (YAML, one key a line) and learns whether all agree;
// when some rank's differs from rank 0's, every rank throws naming the first rank and the first
// key that differ, with both values, e.g. "rank 1 was started with another configuration than
// rank 0: hidden_size is 64 there and 128 on rank 0". Bounded by the store's timeout.
void check_same_configuration(StoreClient& store, int rank, int world_size, const std::string& config_yaml);

// Asked by a rank whose collective failed (communicator.h, FailureExplainer): which other ranks
// are to blame. For a failure of this rank's own (`peer_fault` false) only ranks already gone are
// named, at once, and this rank posts nothing: when it ends, the others find it gone. For a peer
// fault this rank first posts that it failed too, so that no other rank blames it. Then, for up to
// `grace`, it reads which ranks posted the same. Ranks that did not post are either gone or silent:
// - gone: the rank's store connection closed, because the process exited or died. Each rank
//   registers its connection for this when it joins. Named at once, e.g. "lost rank 1".
// - silent: the rank stayed connected but posted nothing within `grace`, so it hung, was stopped,
//   or is that much behind. For example: "rank 1 did not answer within 3 s (hung, stopped, or
//   slower than this rank by that much)".
// When the store cannot be reached, rank 0 (which serves it) is the one lost: "lost rank 0 (...)",
// unless rank 0 was seen failing too. When every rank failed alike, the answer is "".
std::string lost_ranks(const ProcessPlace& place, std::chrono::milliseconds grace, bool peer_fault = true);

// How long lost_ranks waits for the other ranks to fail too: the group's `timeout`, clamped to
// 2-10 s. Survivors that enter the failed collective later than that after this rank are named as
// not answering.
std::chrono::milliseconds lost_rank_grace(std::chrono::milliseconds timeout);

// Where the other ranks reach this host: the interface $GLOO_SOCKET_IFNAME names (PyTorch's
// variable) when set, 127.0.0.1 when the master is on loopback, else this host's name.
GlooCommunicator::Address gloo_address(const ProcessPlace& place, const EnvironmentLookup& environment);

}  // namespace kiln
