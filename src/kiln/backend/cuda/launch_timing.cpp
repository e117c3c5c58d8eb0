#include "kiln/backend/cuda/launch_timing.h"

#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string_view>

#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/stream.h"

namespace kiln::cuda {
namespace {

struct Pending {
  cudaEvent_t start = nullptr, end = nullptr;
  const void* kernel = nullptr;
  std::string label;  // empty: the kernel's name
  cudaStream_t stream = nullptr;
  const char* stream_name = nullptr;
  bool ended = false;  // the end event was recorded
};

struct State {
  bool on = false;
  uint64_t generation = 0;      // bumped whenever `pending` is replaced: older indices are stale
  cudaEvent_t epoch = nullptr;  // recorded on the compute stream when timing was turned on
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> spare;           // events whose times were taken, for reuse while on
  std::map<const void*, std::string> names;  // kernels' display names, resolved once each
};

State& state() {
  static State s;
  return s;
}

cudaEvent_t event() {
  State& s = state();
  if (!s.spare.empty()) {
    cudaEvent_t reused = s.spare.back();
    s.spare.pop_back();
    return reused;
  }
  cudaEvent_t created = nullptr;
  check_cuda(cudaEventCreate(&created), "creating an event to time a launch");
  return created;
}

// Starts timing a piece of work; its index in the pending list, or -1 where nothing is timed.
int begin(const void* kernel, std::string_view label, cudaStream_t stream, const char* stream_name) {
  State& s = state();
  if (!s.on || compute_stream_capturing()) return -1;
  Pending pending{event(), event(), kernel, std::string(label), stream, stream_name};
  check_cuda(cudaEventRecord(pending.start, stream), "recording a launch's start");
  s.pending.push_back(pending);
  return static_cast<int>(s.pending.size()) - 1;
}

const std::string& name_of(const void* kernel) {
  State& s = state();
  auto [at, added] = s.names.try_emplace(kernel);
  if (added) {
    const char* mangled = nullptr;
    at->second = cudaFuncGetName(&mangled, kernel) == cudaSuccess && mangled ? kernel_display_name(mangled)
                                                                             : "a kernel (no name from CUDA)";
    cudaGetLastError();  // a failed lookup leaves no error behind for the next launch's check
  }
  return at->second;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

}  // namespace

void set_launch_timing(bool on) {
  State& s = state();
  if (on && !s.on) {
    s.epoch = event();
    check_cuda(cudaEventRecord(s.epoch, compute_stream()), "recording the start of launch timing");
  }
  s.on = on;
  if (on) return;
  // Nothing here throws (it runs as a profile unwinds): pending events are destroyed untaken,
  // which CUDA allows, releasing them once they complete.
  for (const Pending& pending : s.pending) {
    cudaEventDestroy(pending.start);
    cudaEventDestroy(pending.end);
  }
  s.pending.clear();
  ++s.generation;
  for (cudaEvent_t spare : s.spare) cudaEventDestroy(spare);
  s.spare.clear();
  if (s.epoch) cudaEventDestroy(s.epoch);
  s.epoch = nullptr;
}
bool launch_timing() { return state().on; }

TimedLaunch::TimedLaunch(const void* kernel)
    : index_(launch_timing() ? begin(kernel, {}, compute_stream(), kComputeStream) : -1),
      generation_(state().generation) {}
TimedLaunch::TimedLaunch(const char* label)
    : index_(launch_timing() ? begin(nullptr, label, compute_stream(), kComputeStream) : -1),
      generation_(state().generation) {}
TimedLaunch::TimedLaunch(std::string_view label, cudaStream_t stream, const char* stream_name)
    : index_(launch_timing() ? begin(nullptr, label, stream, stream_name) : -1), generation_(state().generation) {}

TimedLaunch::~TimedLaunch() {
  State& s = state();
  // Timing turned off, or the list taken, since: that entry is gone.
  if (index_ < 0 || generation_ != s.generation) return;
  Pending& pending = s.pending[static_cast<size_t>(index_)];
  pending.ended = cudaEventRecord(pending.end, pending.stream) == cudaSuccess;  // no throw from here
}

std::vector<LaunchTime> take_launch_times() {
  State& s = state();
  std::vector<LaunchTime> times;
  std::vector<Pending> pending = std::move(s.pending);
  s.pending.clear();
  ++s.generation;
  if (!pending.empty()) check_cuda(cudaEventSynchronize(s.epoch), "waiting for the start of launch timing");
  for (Pending& p : pending) {
    bool done = p.ended;
    if (done && std::string_view(p.stream_name) != kComputeStream) {
      const cudaError_t state_of_work = cudaEventQuery(p.end);
      if (state_of_work == cudaErrorNotReady) {  // still running: kept for a later call
        s.pending.push_back(std::move(p));
        continue;
      }
      done = state_of_work == cudaSuccess;  // else its stream failed, which its owner reports
      cudaGetLastError();
    }
    if (done) {
      float ms = 0.0f, start_ms = 0.0f;
      check_cuda(cudaEventSynchronize(p.end), "waiting for a timed launch");
      check_cuda(cudaEventElapsedTime(&ms, p.start, p.end), "reading a launch's time");
      check_cuda(cudaEventElapsedTime(&start_ms, s.epoch, p.start), "reading a launch's start");
      times.push_back({p.label.empty() ? name_of(p.kernel) : p.label, static_cast<double>(ms),
                       static_cast<double>(start_ms), p.stream_name});
    }
    s.spare.push_back(p.start);
    s.spare.push_back(p.end);
  }
  return times;
}

std::string kernel_display_name(const char* mangled) {
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                              &std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;  // a name given demangled stays
  // The parameters: from the '(' that opens the parenthesis the name ends with.
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
      if (depth == 0) {
        name.erase(i);
        break;
      }
    }
  }
  if (name.starts_with("void ")) name.erase(0, 5);  // kernels return nothing
  for (const char* scope : {"(anonymous namespace)::", "kiln::cuda::", "kiln::"}) replace_all(name, scope, "");
  replace_all(name, "__nv_bfloat16", "bf16");
  replace_all(name, "__half", "fp16");
  return name;
}

}  // namespace kiln::cuda
