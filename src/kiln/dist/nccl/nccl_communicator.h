// NcclCommunicator: the Communicator of GPU ranks, on NCCL (the library in the CUDA toolkit that
// PyTorch's and Megatron's "nccl" process groups use). NCCL moves and reduces the bytes in GPU
// memory; this class orders its work against the CUDA back-end's compute stream and bounds every
// wait. Compiled only in CUDA builds (and, for the CPU emulator, against a one-rank stand-in of
// NCCL: tests/cuda_emulator/nccl_stand_in.cpp).
//
// Streams (ARCHITECTURE.md decision 7: no device-wide waits): every operation runs on a
// communication stream of its own. Issuing one records an event on the compute stream
// (backend/cuda/stream.h) that the communication stream waits for, so the operation reads its
// buffer after every op already queued there, and the compute stream keeps running: a gradient
// bucket is reduced while the backward goes on. A completion event is recorded after it.
// Waiting: CommWork::wait() polls the completion event on the host, and between polls NCCL's
// asynchronous error; it returns once the operation is done. NCCL never times out by itself (a
// peer that died leaves its kernel spinning), so a wait longer than `timeout`, or an asynchronous
// error, aborts the communicator (ncclCommAbort ends its kernels) and throws a kiln::Error naming
// the operation and, through `explain_failure` (communicator.h), the ranks to blame: timeouts and
// NCCL's remote and system errors are peer faults, CUDA errors and misuse this rank's own. The communicator is then
// unusable: later operations fail at once with the first failure.
// Connection: rank 0 makes NCCL's unique id and posts it in the rendezvous store; the others read
// it there. The communicator is created non-blocking and polled, so a rank that never comes ends
// the wait at `timeout` too.
// Lifetime: a CommWork must not outlive its communicator. Destruction finalizes the communicator
// (waiting, within `timeout`, for the operations in flight) and aborts it when that fails.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kiln/dist/communicator.h"

namespace kiln {

class StoreClient;

// The communicator of `rank` of `world_size` on GPU `device` (the local rank), joined through
// `store`. Errors (no such GPU, NCCL refusing the group, a rank that never connects) name the rank
// and what NCCL said.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int world_size, int device, StoreClient& store,
                                                     std::chrono::milliseconds timeout,
                                                     FailureExplainer explain_failure = {});

}  // namespace kiln
