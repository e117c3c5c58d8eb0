// BatchStager: moves input batches (token ids and targets) to the device so that the copy of batch
// k+1 overlaps the compute of batch k. It rotates `slots` slots; each has a host buffer (page-
// locked when `pinned`, so the copy is an asynchronous DMA rather than a staged, blocking copy)
// and a device buffer. With `own_stream` the copies run on a dedicated copy stream and are handed
// to the compute stream with events; otherwise they are queued on the compute stream itself.
//
//   std::span<int32_t> host = stager.next_host_slot();  // waits until the slot's last copy has
//                                                       // left its host buffer
//   ... write the batch (ints_per_batch values) into host ...
//   const int32_t* device = stager.submit();  // queues the copy; returns where the batch will be
//   stager.wait_for_copy(device);             // before the first kernel that reads it
//   stager.release(device);                   // after the last kernel that reads it; the next
//                                             // copy into this slot waits for that point
// On the CPU back-end "device" memory is host memory: submit() returns the host slot itself and
// the waits do nothing. One host thread uses a stager.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln {

struct StagerOptions {
  size_t ints_per_batch = 0;
  int slots = 2;
  bool pinned = true;
  bool own_stream = true;
};

class BatchStager {
 public:
  virtual ~BatchStager() = default;
  virtual std::span<int32_t> next_host_slot() = 0;
  virtual const int32_t* submit() = 0;
  virtual void wait_for_copy(const int32_t* device) = 0;
  virtual void release(const int32_t* device) = 0;
  virtual size_t host_bytes() const = 0;    // all slots; pinned or pageable as asked
  virtual size_t device_bytes() const = 0;  // all slots (0 on the CPU)
};

}  // namespace kiln
