// The CUDA runtime calls kiln makes, defined for the CPU emulator (cuda_emulator.h) under their real
// names and signatures (checked against the toolkit's cuda_runtime_api.h, included here), so the
// CUDA back-end compiled by the host compiler links against this instead of libcudart: one device,
// "device" memory on the host heap within a fixed capacity, streams and events that complete at
// once (every launch and copy runs when it is issued), the sticky-error rules of cudaGetLastError.
//
// What it cannot check: overlap between streams (the missing-event bugs that would only show as
// races on a GPU) and timing (events measure the host's wall clock).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "cuda_emulator.h"

namespace {

// The emulated device's memory: small enough that a plan for a real GPU's worth of activations
// fails as it would on one, large enough for every test model.
constexpr size_t kDeviceBytes = size_t{8} << 30;
constexpr size_t kAlignment = 256;  // cudaMalloc's alignment

struct Memory {
  std::mutex mutex;
  std::map<void*, size_t> device, host;  // live allocations and their sizes
  size_t device_bytes = 0;
};
Memory& memory() {
  static Memory instance;
  return instance;
}

struct Event {
  std::chrono::steady_clock::time_point recorded{};
  bool timing = true;
};

cudaError_t status(int error) { return static_cast<cudaError_t>(error); }

void* aligned_allocation(size_t bytes) {
  return ::operator new[](bytes ? bytes : 1, std::align_val_t{kAlignment}, std::nothrow);
}
void aligned_free(void* pointer) { ::operator delete[](pointer, std::align_val_t{kAlignment}); }

}  // namespace

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
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  *pointer = nullptr;
  if (bytes > kDeviceBytes - m.device_bytes) return cudaErrorMemoryAllocation;
  void* allocation = aligned_allocation(bytes);
  if (!allocation) return cudaErrorMemoryAllocation;
  m.device[allocation] = bytes;
  m.device_bytes += bytes;
  *pointer = allocation;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (!pointer) return cudaSuccess;
  Memory& m = memory();
  std::lock_guard lock(m.mutex);
  const auto found = m.device.find(pointer);
  if (found == m.device.end()) return cudaErrorInvalidValue;
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
  if (bytes) std::memmove(destination, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(destination, source, bytes, kind);
}

// Streams: distinct handles with nothing behind them, since work completes when issued.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  return event ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto* created = new Event;
  created->timing = (flags & cudaEventDisableTiming) == 0;
  *event = reinterpret_cast<cudaEvent_t>(created);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (!event) return cudaErrorInvalidResourceHandle;
  reinterpret_cast<Event*>(event)->recorded = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event ? cudaSuccess : cudaErrorInvalidResourceHandle; }
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  const auto* first = reinterpret_cast<const Event*>(start);
  const auto* last = reinterpret_cast<const Event*>(end);
  if (!first || !last || !first->timing || !last->timing) return cudaErrorInvalidResourceHandle;
  *milliseconds = std::chrono::duration<float, std::milli>(last->recorded - first->recorded).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  return status(cuda_emulator::set_max_dynamic_shared_bytes(kernel, value));
}

}  // extern "C"
