// What the NCCL stand-in of the CPU emulator (nccl_stand_in.cpp) lets a test see: how many
// collectives of each kind the communicators of this process issued.
#pragma once

#include <cstdint>

namespace nccl_stand_in {

struct Calls {
  int64_t all_reduce = 0, reduce_scatter = 0, reduce = 0, all_gather = 0, broadcast = 0, aborts = 0;
};
Calls calls();

}  // namespace nccl_stand_in
