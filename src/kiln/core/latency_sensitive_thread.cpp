#include "kiln/core/latency_sensitive_thread.h"

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#endif

namespace kiln {

#if defined(__linux__) && defined(SYS_sched_setattr)
namespace {

// sched_setattr(2)'s argument (the first, SCHED_ATTR_SIZE_VER0 fields); glibc 2.36 has no wrapper.
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;  // SCHED_OTHER under EEVDF: the requested slice, in nanoseconds
  uint64_t deadline;
  uint64_t period;
};

bool get_attributes(SchedAttr& attributes) {
  attributes = {};
  return syscall(SYS_sched_getattr, 0, &attributes, sizeof(attributes), 0) == 0;
}

}  // namespace

bool request_short_time_slice(std::chrono::microseconds slice) {
  SchedAttr attributes;
  if (!get_attributes(attributes) || attributes.policy != SCHED_OTHER) return false;
  const uint64_t wanted = static_cast<uint64_t>(std::chrono::nanoseconds(slice).count());
  attributes.size = sizeof(attributes);
  attributes.runtime = wanted;  // the nice value read above is kept as it is
  if (syscall(SYS_sched_setattr, 0, &attributes, 0) != 0) return false;
  // Kernels without custom slices accept the call and ignore the runtime: read it back.
  return get_attributes(attributes) && attributes.runtime == wanted;
}

#else

bool request_short_time_slice(std::chrono::microseconds) { return false; }

#endif

}  // namespace kiln
