// Device time of each piece of work the CUDA back-end issues, for --profile-ops (op_timing.h) and
// the step trace (op_tracing.h): while on, every kernel launch (launch.cuh), cuBLASLt product,
// cuDNN attention call and CUB sort on the compute stream is bracketed by two events, and so are
// the work on other streams that asks for it (a batch's copy, an NCCL collective).
// take_launch_times() names each and hands over its time, so that a profile's op (a product and
// the cast behind it, an attention call and the casts of its outputs) splits into the work that
// took its time, without an external profiler. Off, a launch costs one test of a flag. The events
// wait on nothing and are recorded only outside a CUDA graph's capture (CudaBackend refuses
// profiling with graphs anyway). One state per process, as the compute stream is; used from the
// training thread, which issues the ops, the copies and the collectives.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/launch_time.h"

namespace kiln::cuda {

// Turning it off drops what was timed and not taken and frees the events; it never throws.
void set_launch_timing(bool on);
bool launch_timing();

// Brackets one piece of work: constructed just before it is issued on the compute stream,
// destroyed just after; named by the kernel's entry (resolved when taken) or by a label.
class TimedLaunch {
 public:
  explicit TimedLaunch(const void* kernel);
  explicit TimedLaunch(const char* label);
  // Work on another stream, which belongs to no op (a batch's host-to-device copy, a collective):
  // timed on `stream` and listed under `stream_name` (a literal: "copy stream"), which
  // --profile-ops' per-op table leaves out and the step trace shows as a track of its own. The
  // label is copied only while timing is on.
  TimedLaunch(std::string_view label, cudaStream_t stream, const char* stream_name);
  ~TimedLaunch();
  TimedLaunch(const TimedLaunch&) = delete;
  TimedLaunch& operator=(const TimedLaunch&) = delete;

 private:
  int index_ = -1;  // in the pending list; -1 when timing is off
  uint64_t generation_ = 0;  // of the pending list index_ points into
};

// Returns each piece of work's name, device time and start (since timing was turned on), in the
// order it was issued: the compute stream's after waiting for them; the other streams' where they
// have finished, the rest kept for a later call (a collective in flight is never waited for here:
// its communicator's wait bounds it), or dropped when their stream failed.
std::vector<LaunchTime> take_launch_times();

// "cast_fp8_kernel<bf16, (Fp8Source)0>" from a kernel's mangled name (as cudaFuncGetName gives
// it): the demangled name without its return type, kiln's namespaces and its parameters, CUDA's
// 16-bit types by their short names. A name that does not demangle is taken as already demangled.
std::string kernel_display_name(const char* mangled);

}  // namespace kiln::cuda
