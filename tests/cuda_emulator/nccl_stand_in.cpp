// The NCCL calls kiln makes (dist/nccl/nccl_communicator.cpp), defined for the CPU emulator under
// their real names and signatures (checked against the toolkit's nccl.h, included here), so the
// NCCL communicator compiled by the host compiler links against this instead of libnccl and CI
// runs it: the rendezvous, the ordering against the compute stream, the polling and the abort.
//
// One rank only: a group of one moves no bytes (an in-place collective of one rank leaves its
// buffer as it is; an out-of-place one copies on the stream), so nothing here is a collective
// algorithm. A group of more ranks is refused with ncclInvalidUsage, as NCCL refuses a misuse.
// Communicators are non-blocking when their config says so, as NCCL's: creation answers
// ncclInProgress and the first poll of ncclCommGetAsyncError does too.
//
// Faults, for tests, from KILN_NCCL_STAND_IN_FAULT when a communicator is created:
//   init-hang        creation never completes (a rank that never comes): in progress until aborted
//   peer-error       the first collective's kernel spins and the communicator's asynchronous error
//                    becomes ncclRemoteError (a peer that died), until aborted
//   collective-hang  the first collective's kernel spins and no error comes (a peer that hangs)
// A spinning kernel holds its stream (cuda_emulator::hold_stream); ncclCommAbort releases it, as
// aborting a real communicator ends its kernels.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda_emulator.h"
#include "nccl_stand_in.h"

struct ncclComm {
  int rank = 0, nranks = 1;
  bool blocking = true;
  std::string fault;
  int init_polls_left = 0;             // ncclInProgress answers still due for the creation
  ncclResult_t async = ncclSuccess;    // what ncclCommGetAsyncError reports after the creation
  cudaStream_t held = nullptr;         // the stream a spinning kernel holds
  std::string last_error;
};

namespace {

std::mutex calls_mutex;
nccl_stand_in::Calls totals;

std::string& global_last_error() {
  static std::string text;
  return text;
}

ncclResult_t invalid(ncclComm* comm, const std::string& why) {
  (comm ? comm->last_error : global_last_error()) = why;
  return ncclInvalidUsage;
}

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// One collective of a group of one: `recv` gets `send`'s bytes, on the stream; a fault spins.
ncclResult_t collective(ncclComm* comm, int64_t nccl_stand_in::Calls::*counter, const void* send, void* recv,
                        size_t bytes, cudaStream_t stream) {
  if (!comm) return invalid(nullptr, "null communicator");
  if (comm->init_polls_left > 0 || comm->fault == "init-hang")
    return invalid(comm, "the communicator is not initialized yet");
  {
    std::lock_guard lock(calls_mutex);
    ++(totals.*counter);
  }
  if (send != recv && bytes > 0 &&
      cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    return ncclUnhandledCudaError;
  if ((comm->fault == "peer-error" || comm->fault == "collective-hang") && !comm->held) {
    comm->held = stream;
    cuda_emulator::hold_stream(stream, true);
    if (comm->fault == "peer-error") {
      comm->async = ncclRemoteError;
      comm->last_error = "NET/Socket : peer 127.0.0.1 closed the connection (stand-in)";
    }
  }
  return ncclSuccess;
}

}  // namespace

nccl_stand_in::Calls nccl_stand_in::calls() {
  std::lock_guard lock(calls_mutex);
  return totals;
}

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm ? comm->last_error.c_str() : global_last_error().c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, "kiln-nccl-stand-in", 18);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (std::memcmp(id.internal, "kiln-nccl-stand-in", 18) != 0) return invalid(nullptr, "not this stand-in's id");
  if (nranks != 1 || rank != 0)
    return invalid(nullptr, "the emulator's NCCL stand-in makes groups of one rank (rank 0 of 1)");
  auto* comm = new ncclComm;
  comm->blocking = !config || config->blocking != 0;
  if (const char* fault = std::getenv("KILN_NCCL_STAND_IN_FAULT")) comm->fault = fault;
  *out = comm;
  if (comm->fault == "init-hang") return comm->blocking ? ncclInternalError : ncclInProgress;
  if (comm->blocking) return ncclSuccess;
  comm->init_polls_left = 1;
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm) return invalid(nullptr, "null communicator");
  if (comm->fault == "init-hang") {
    *async = ncclInProgress;
  } else if (comm->init_polls_left > 0) {
    --comm->init_polls_left;
    *async = ncclInProgress;
  } else {
    *async = comm->async;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return invalid(nullptr, "null communicator");
  return comm->blocking ? ncclSuccess : ncclInProgress;  // the next poll answers done
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return invalid(nullptr, "null communicator");
  if (comm->held) cuda_emulator::hold_stream(comm->held, false);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::lock_guard lock(calls_mutex);
    ++totals.aborts;
  }
  return ncclCommDestroy(comm);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(comm, &nccl_stand_in::Calls::all_reduce, send, recv, count * type_bytes(type), stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t,
                               ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, &nccl_stand_in::Calls::reduce_scatter, send, recv, recvcount * type_bytes(type), stream);
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  if (root != 0) return invalid(comm, "root outside the group of one");
  return collective(comm, &nccl_stand_in::Calls::reduce, send, recv, count * type_bytes(type), stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(comm, &nccl_stand_in::Calls::all_gather, send, recv, sendcount * type_bytes(type), stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0) return invalid(comm, "root outside the group of one");
  return collective(comm, &nccl_stand_in::Calls::broadcast, send, recv, count * type_bytes(type), stream);
}

}  // extern "C"
