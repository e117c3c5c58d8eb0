// The CUDA runtime calls kiln makes, defined for the CPU emulator (cuda_emulator.h) under their
// real names and signatures (checked against the toolkit's cuda_runtime_api.h, included here), so
// the CUDA back-end compiled by the host compiler links against this instead of libcudart: one
// device, "device" memory on the host heap within a fixed capacity, the sticky-error rules of
// cudaGetLastError, and streams that keep their order as late as CUDA allows: work on the legacy
// default stream runs when issued, but work on a stream of its own (kiln's compute stream and copy
// stream) runs only when something must wait for it (an event on it waited for,
// cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree). So a copy on kiln's copy stream lands
// as late as it could on a GPU: a kernel that reads the slot without waiting for the copy's event
// reads the old batch, and a host slot refilled before its copy's event was waited for is copied
// refilled (pinned memory is read when the copy runs; pageable memory when it is issued, as CUDA
// stages it); and a result read on the host without waiting for the compute stream is stale.
//
// Graphs: a stream being captured (cudaStreamBeginCapture) records its work instead of queueing
// it; an instantiated graph replays the records in order when launched. What CUDA forbids while a
// capture is open (synchronising, cudaMalloc, cudaFree, synchronous copies, work on the legacy
// stream, events on the captured stream) fails and invalidates the capture, so its end reports it.
//
// What it cannot check: work on the default stream running late, and timing (events read the
// host's wall clock).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "cuda_emulator.h"

namespace {

// The emulated device's memory: small enough that a plan for a real GPU's worth of activations
// fails as it would on one, large enough for every test model.
constexpr size_t kDeviceBytes = size_t{8} << 30;
constexpr size_t kAlignment = 256;  // cudaMalloc's alignment
// Every cudaMalloc allocation is followed by a guard band, checked when it is freed: a kernel or
// copy that wrote past the end aborts the test there, naming the allocation's size.
constexpr size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xA5;

struct Memory {
  std::mutex mutex;
  std::map<void*, size_t> device, host;  // live allocations and their sizes
  size_t device_bytes = 0;
};
Memory& memory() {
  static Memory instance;
  return instance;
}

struct Stream;

struct Event {
  std::chrono::steady_clock::time_point recorded{};
  bool timing = true;
  Stream* stream = nullptr;  // the stream whose work it waits for, null once that work has run
  uint64_t ticket = 0;       // the work on `stream` up to and including this ticket
};

// What a captured stream has recorded (cudaGraph_t), or an instantiated graph (cudaGraphExec_t).
struct Graph {
  std::vector<std::function<void()>> work;
};

// A stream other than the default one: work in issue order, run when something waits for it.
struct Stream {
  struct Work {
    uint64_t ticket;
    std::function<void()> run;
  };
  std::deque<Work> pending;
  uint64_t next_ticket = 1;
  std::unique_ptr<Graph> capture;  // set between cudaStreamBeginCapture and cudaStreamEndCapture
  bool capture_invalidated = false;
  bool held = false;  // cuda_emulator::hold_stream

  uint64_t enqueue(std::function<void()> run) {
    if (capture) {
      capture->work.push_back(std::move(run));
      return 0;
    }
    pending.push_back({next_ticket, std::move(run)});
    return next_ticket++;
  }
  void run_through(uint64_t ticket) {
    while (!pending.empty() && pending.front().ticket <= ticket) {
      const std::function<void()> run = std::move(pending.front().run);
      pending.pop_front();
      run();
    }
  }
  void run_all() { run_through(next_ticket); }
};

Stream* stream_of(cudaStream_t stream) {
  return reinterpret_cast<Stream*>(stream);
}  // null: default
Event* event_of(cudaEvent_t event) { return reinterpret_cast<Event*>(event); }

std::vector<Stream*>& live_streams() {
  static std::vector<Stream*> streams;
  return streams;
}

// The stream being captured, if any (kiln captures from one thread, one stream at a time).
Stream*& capturing() {
  static Stream* stream = nullptr;
  return stream;
}

// For a call CUDA forbids while a capture is open: invalidates the capture and returns true.
bool refused_during_capture() {
  if (!capturing()) return false;
  capturing()->capture_invalidated = true;
  return true;
}

// What a synchronisation reports: a kernel that failed while the stream ran (its error is sticky).
cudaError_t after_synchronising() {
  return cuda_emulator::peek_last_error() == cudaErrorLaunchFailure ? cudaErrorLaunchFailure
                                                                    : cudaSuccess;
}

// Runs what `event` waits for and marks it reached.
void complete(Event& event) {
  if (event.stream) event.stream->run_through(event.ticket);  // its marker clears event.stream
}

bool pinned(const void* pointer) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  auto after = m.host.upper_bound(const_cast<void*>(pointer));
  if (after == m.host.begin()) return false;
  --after;
  return static_cast<const char*>(pointer) < static_cast<const char*>(after->first) + after->second;
}

cudaError_t status(int error) { return static_cast<cudaError_t>(error); }

void* aligned_allocation(size_t bytes) {
  return ::operator new[](bytes ? bytes : 1, std::align_val_t{kAlignment}, std::nothrow);
}
void aligned_free(void* pointer) { ::operator delete[](pointer, std::align_val_t{kAlignment}); }

}  // namespace

namespace cuda_emulator {
void hold_stream(void* stream, bool held) {
  if (Stream* queue = stream_of(static_cast<cudaStream_t>(stream))) queue->held = held;
}
}  // namespace cuda_emulator

extern "C" {

cudaError_t cudaGetLastError(void) { return status(cuda_emulator::get_last_error()); }
cudaError_t cudaPeekAtLastError(void) { return status(cuda_emulator::peek_last_error()); }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulator)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "CUDA error (emulator)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *properties = cudaDeviceProp{};
  std::strncpy(properties->name, "CPU emulator of CUDA (sm_90)", sizeof(properties->name) - 1);
  properties->major = 9;
  properties->minor = 0;
  properties->totalGlobalMem = kDeviceBytes;
  properties->multiProcessorCount = 1;
  properties->warpSize = 32;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 1; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(cuda_emulator::shared_bytes_per_sm());
      return cudaSuccess;
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaDeviceSynchronize(void) {
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  for (Stream* stream : live_streams()) stream->run_all();
  return after_synchronising();
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  *pointer = nullptr;
  if (bytes > kDeviceBytes - m.device_bytes) return cudaErrorMemoryAllocation;
  void* allocation = aligned_allocation(bytes + kGuardBytes);
  if (!allocation) return cudaErrorMemoryAllocation;
  std::memset(static_cast<char*>(allocation) + bytes, kGuardByte, kGuardBytes);
  m.device[allocation] = bytes;
  m.device_bytes += bytes;
  *pointer = allocation;
  return cudaSuccess;
}

// As CUDA's, it waits for all work first: a kernel still queued may use the memory.
cudaError_t cudaFree(void* pointer) {
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  if (!pointer) return cudaSuccess;
  for (Stream* stream : live_streams()) stream->run_all();
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  const auto found = m.device.find(pointer);
  if (found == m.device.end()) return cudaErrorInvalidValue;
  const auto* guard = static_cast<const unsigned char*>(pointer) + found->second;
  for (size_t i = 0; i < kGuardBytes; ++i)
    if (guard[i] != kGuardByte) {
      std::fprintf(stderr,
                   "cuda emulator: a kernel or copy wrote past the end of a %zu-byte cudaMalloc "
                   "allocation\n",
                   found->second);
      std::abort();
    }
  m.device_bytes -= found->second;
  m.device.erase(found);
  aligned_free(pointer);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  *free_bytes = kDeviceBytes - m.device_bytes;
  *total_bytes = kDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  *pointer = aligned_allocation(bytes);
  if (!*pointer) return cudaErrorMemoryAllocation;
  m.host[*pointer] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* pointer) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  if (m.host.erase(pointer) == 0) return cudaErrorInvalidValue;
  aligned_free(pointer);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind) {
  if (refused_during_capture()) return cudaErrorStreamCaptureImplicit;
  if (bytes) std::memmove(destination, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  Stream* queue = stream_of(stream);
  if (!queue || bytes == 0) return cudaMemcpy(destination, source, bytes, kind);
  // CUDA cannot capture a copy from pageable memory.
  if (queue->capture && !pinned(source) && kind == cudaMemcpyHostToDevice &&
      refused_during_capture())
    return cudaErrorStreamCaptureUnsupported;
  // Pinned memory and device memory are read when the copy runs; pageable host memory is staged
  // now.
  if (kind != cudaMemcpyHostToDevice || pinned(source)) {
    queue->enqueue([=] { std::memmove(destination, source, bytes); });
  } else {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(source),
                                                      static_cast<const char*>(source) + bytes);
    queue->enqueue([=] { std::memmove(destination, staged->data(), bytes); });
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  auto* created = new Stream;
  live_streams().push_back(created);
  *stream = reinterpret_cast<cudaStream_t>(created);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Stream* queue = stream_of(stream);
  if (!queue || queue->capture) return cudaErrorInvalidResourceHandle;
  queue->run_all();  // as CUDA: the work finishes, then the stream is released
  std::erase(live_streams(), queue);
  delete queue;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  if (Stream* queue = stream_of(stream)) queue->run_all();
  return after_synchronising();
}
// The default stream waits at once; another stream waits when its work gets that far.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  Event* awaited = event_of(event);
  if (!awaited) return cudaErrorInvalidResourceHandle;
  Stream* queue = stream_of(stream);
  // Waits on the legacy stream or inside kiln's captures (which wait for no event) are refused.
  if ((!queue || queue->capture) && refused_during_capture())
    return cudaErrorStreamCaptureUnsupported;
  if (!queue || awaited->stream == queue) {
    if (!queue) complete(*awaited);
    return cudaSuccess;
  }
  if (awaited->stream) {
    Stream* other = awaited->stream;
    const uint64_t ticket = awaited->ticket;
    queue->enqueue([other, ticket] { other->run_through(ticket); });
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto* created = new Event;
  created->timing = (flags & cudaEventDisableTiming) == 0;
  *event = reinterpret_cast<cudaEvent_t>(created);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (Event* destroyed = event_of(event)) complete(*destroyed);  // its marker must not outlive it
  delete event_of(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* recorded = event_of(event);
  if (!recorded) return cudaErrorInvalidResourceHandle;
  Stream* queue = stream_of(stream);
  // Records on the legacy stream or inside kiln's captures (which record no event) are refused.
  if ((!queue || queue->capture) && refused_during_capture())
    return cudaErrorStreamCaptureUnsupported;
  if (!queue) {
    recorded->stream = nullptr;
    recorded->recorded = std::chrono::steady_clock::now();
    return cudaSuccess;
  }
  // The marker reaches the event only if the event has not been recorded again since.
  const uint64_t ticket = queue->next_ticket;
  recorded->stream = queue;
  recorded->ticket = queue->enqueue([recorded, ticket] {
    if (recorded->ticket != ticket) return;
    recorded->stream = nullptr;
    recorded->recorded = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Event* awaited = event_of(event);
  if (!awaited) return cudaErrorInvalidResourceHandle;
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  complete(*awaited);
  return after_synchronising();
}
// A query is a wait that does not block: the work up to the event runs and the event is reached,
// unless its stream is held (cuda_emulator::hold_stream).
cudaError_t cudaEventQuery(cudaEvent_t event) {
  Event* queried = event_of(event);
  if (!queried) return cudaErrorInvalidResourceHandle;
  if (refused_during_capture()) return cudaErrorStreamCaptureUnsupported;
  if (queried->stream && queried->stream->held) return cudaErrorNotReady;
  complete(*queried);
  return after_synchronising();
}
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  const Event* first = event_of(start);
  const Event* last = event_of(end);
  if (!first || !last || !first->timing || !last->timing) return cudaErrorInvalidResourceHandle;
  if (first->stream || last->stream) return cudaErrorNotReady;
  *milliseconds = std::chrono::duration<float, std::milli>(last->recorded - first->recorded).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  Stream* queue = stream_of(stream);
  if (!queue) return cudaErrorStreamCaptureUnsupported;  // the legacy stream cannot be captured
  if (capturing()) return cudaErrorIllegalState;
  queue->capture = std::make_unique<Graph>();
  queue->capture_invalidated = false;
  capturing() = queue;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Stream* queue = stream_of(stream);
  if (!queue || !queue->capture) return cudaErrorIllegalState;
  capturing() = nullptr;
  std::unique_ptr<Graph> captured = std::move(queue->capture);
  *graph = nullptr;
  if (queue->capture_invalidated) return cudaErrorStreamCaptureInvalidated;
  *graph = reinterpret_cast<cudaGraph_t>(captured.release());
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const Stream* queue = stream_of(stream);
  *status = queue && queue->capture ? (queue->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                                                   : cudaStreamCaptureStatusActive)
                                    : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* executable, cudaGraph_t graph,
                                 unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *executable = reinterpret_cast<cudaGraphExec_t>(new Graph(*reinterpret_cast<Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t executable, cudaStream_t stream) {
  const auto* graph = reinterpret_cast<const Graph*>(executable);
  if (!graph) return cudaErrorInvalidValue;
  cuda_emulator::submit(stream, [graph] {
    for (const std::function<void()>& work : graph->work) work();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t executable) {
  for (Stream* stream : live_streams()) stream->run_all();  // a queued launch may still replay it
  delete reinterpret_cast<Graph*>(executable);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  return status(cuda_emulator::set_max_dynamic_shared_bytes(kernel, value));
}
// Emulated kernels are host functions without a device entry's name: none is given.
cudaError_t cudaFuncGetName(const char** name, const void*) {
  return status(name ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue);
}

}  // extern "C"

void cuda_emulator::submit(cudaStream_t stream, std::function<void()> work) {
  Stream* queue = stream_of(stream);
  if (!queue) {
    if (!refused_during_capture()) work();  // the legacy stream cannot take work during a capture
    return;
  }
  queue->enqueue(std::move(work));
}
