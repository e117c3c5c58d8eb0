// TracingBackend: while a step trace records (core/trace.h, --profile), every op and host copy
// becomes a span on the calling thread under its op_work label ("matmul_forward 64x128x512
// +bias"), the bytes the back-end holds become the counter "memory allocated (bytes)" (at the
// first op and whenever they change), and the device work the back-end times inside the ops
// (Backend::set_launch_timing: CUDA's kernels, library products and attention calls) goes on the
// track "compute stream", and the work timed on other streams meanwhile (batches'
// host-to-device copies, NCCL's collectives) on "copy stream" and "communication stream". On the CPU an op's span is the op's work; on CUDA it is its launch,
// and the compute stream shows when the work ran.
//
// Device times are placed on the host clock by the moment timing was turned on
// (start_device_timing(), after a device synchronisation), so the two clocks start together, to
// the few microseconds an event's recording takes. Not recording, an op costs one atomic load more.
// Graphs are refused by the Config (a replay issues no op to record); --profile-ops' timer
// drives the same launch timing, so the two are not combined either.
#pragma once

#include <cstdint>
#include <memory>

#include "kiln/backend/op_decorator.h"

namespace kiln {

class TracingBackend final : public OpDecorator {
 public:
  explicit TracingBackend(std::unique_ptr<Backend> inner) : OpDecorator(std::move(inner)) {}
  ~TracingBackend() override;

  // The step trace's recording (core/trace.h) starts: waits for the device and times the device
  // work from now on, and the memory counter starts again.
  void start_device_timing();
  // Puts the device work timed since the last call on its stream's track (waiting for the compute
  // stream), then starts timing afresh (start_device_timing()): work on other streams still in
  // flight is left out. Call while recording, at the end of each traced step.
  void record_device_work();
  // The recording ends: the device work timed and not recorded is dropped. Never throws.
  void stop_device_timing();

 private:
  void around(const std::function<OpWork()>& work, const std::function<void()>& run) override;
  bool device_timing_ = false;  // the inner back-end's launch timing is on
  int64_t device_epoch_ns_ = 0;  // host time when it was turned on
  size_t recorded_bytes_ = 0;   // the allocated bytes last put on the counter
  bool bytes_recorded_ = false;
};

}  // namespace kiln
