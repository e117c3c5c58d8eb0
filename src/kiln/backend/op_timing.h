// OpTimingBackend: a Backend that forwards every call to another and times each op, waiting for
// the device after each one, so a step's time splits by op (and, for matrix products and
// attention, by shape) without an external profiler. The waits remove the overlap of one op's
// launch with the previous op's work, so the totals are each op's own time plus a launch gap
// and the step is slower than unprofiled: use it to see where time goes, not to measure speed.
// Selected by the config key `profile_ops` (`--profile-ops`). Where the back-end can (CUDA), it
// also times on the device each piece of work inside an op (Backend::set_launch_timing): a
// product's cuBLASLt call and the cast behind it, cuDNN's attention and the casts of its outputs,
// a LayerNorm's kernel and its column sums' last pass, each listed under the op.
//
// Each op also counts its work (op_work.h: useful FLOPs, least bytes moved), so the table shows
// the rate each op achieved and, given the device's limits, how close it came to its roofline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/op_decorator.h"
#include "kiln/backend/op_work.h"

namespace kiln {

class OpTimingBackend final : public OpDecorator {
 public:
  explicit OpTimingBackend(std::unique_ptr<Backend> inner);  // turns the inner back-end's launch timing on
  ~OpTimingBackend() override;                               // and off

  std::vector<OpTotals> times() const { return ledger_.totals(); }  // most total time first
  void reset_times() { ledger_.clear(); }
  // A table for people: op, calls, total and per-call ms, share of the timed total, and the rate
  // achieved: TFLOP/s for products and attention, GB/s for the rest. With `limits` (the device's,
  // perf/roofline.h), also each op's roofline time as a share of its measured time. Under each op,
  // the device work timed inside it: launches, total and per-op-call ms, share of the op's time.
  static std::string format(const std::vector<OpTotals>& times,
                            const DeviceLimits* limits = nullptr);

 private:
  // Runs the op, waits for the device, and adds the wall time, its work and the device work timed
  // inside it to the ledger.
  void around(const std::function<OpWork()>& work, const std::function<void()>& run) override;
  OpLedger ledger_;
};

}  // namespace kiln
