// A group of one rank over NCCL inside the test process (the only group one GPU allows), with its
// own rendezvous store on a free loopback port: real NCCL on a GPU machine, the emulator's
// one-rank stand-in in CI.
#pragma once

#include <chrono>
#include <memory>

#include "kiln/dist/process_group.h"
#include "kiln/dist/worker_group.h"

namespace kiln::testing {

inline std::unique_ptr<ProcessGroup> join_alone_over_nccl(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  ProcessPlace place;
  place.source = "torchrun variables";
  place.master_port = dist::find_free_port();
  return join_process_group(place, "nccl", timeout, "test: a group of one over nccl\n");
}

}  // namespace kiln::testing
