// What each op of the table must do at least, whatever back-end runs it: its useful FLOPs and the
// bytes it must move, under a label of its name and, for matrix products and attention, its shape.
// The per-op profile (op_timing.h) divides measured times by this work to give rates; the
// counting back-end (op_counting.h) adds it up for a step that is never run, and `roofline_ms`
// turns it into the least time a device could take (perf/roofline.h).
//
// FLOPs: matrix products 2MKN forward, 4MKN backward with the input gradient, 2MKN without;
// attention 4 B NH T^2 HS forward and 2.5 times that backward, halved when causal (the
// FlashAttention papers' convention); 0 for every other op.
// Bytes: each tensor an op reads or writes once; accumulated outputs twice (read and written);
// embedding rows as gathered; fp8 products also write and read back each fp8 copy of an operand
// they cast (fp8_workspace.h), and kept input codes (ops.h, in_fp8_t) are written once by the
// forward and only read by the backward, which then reads no 16-bit input. Scratch an
// implementation adds on top (the materialised attention path's T x T matrices, a fallback
// kernel's extra pass) is not counted: that is the gap between an implementation and this bound.
// Passes: the part of an op's bytes that a memory-bound pass of its own moves before or after
// the op's arithmetic, which therefore cannot hide under it: an fp8 product's casts (each reads a
// 16-bit operand and writes its codes) and the GELU output's cast (MatmulForward::gelu_fp8).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/backend/launch_time.h"
#include "kiln/backend/ops.h"

namespace kiln {

struct OpWork {
  std::string op;  // e.g. "matmul_forward 4096x768x3072 +bias +gelu", "layernorm_backward"
  double flops = 0.0, bytes = 0.0;
  bool fp8 = false;        // a product on fp8 tensor cores
  bool host_copy = false;  // bytes over the host link, not device memory: no device roofline
  double pass_bytes = 0.0;  // of `bytes`, those moved by passes of their own (above)
};

OpWork work_of(const EmbeddingForward& args);
OpWork work_of(const EmbeddingBackward& args);
OpWork work_of(const LayerNormForward& args);
OpWork work_of(const LayerNormBackward& args);
OpWork work_of(const MatmulForward& args);
OpWork work_of(const MatmulBackward& args);
OpWork work_of(const GeluForward& args);
OpWork work_of(const GeluBackward& args);
OpWork work_of(const TanhForward& args);
OpWork work_of(const TanhBackward& args);
OpWork work_of(const GatherRows& args);
OpWork work_of(const GatherRowsBackward& args);
OpWork work_of(const MaskRows& args);
OpWork work_of(const AttentionForward& args);
OpWork work_of(const AttentionBackward& args);
OpWork work_of(const SoftmaxCrossEntropy& args);
OpWork work_of(const AdamwStep& args);
OpWork work_of(const SumOfSquares& args);
OpWork work_of(const Fp8UpdateScales& args);
OpWork work_of(const Dropout& args);
OpWork work_of(const Fill& args);
OpWork work_of(const Convert& args);

// The device work of one name inside an op's calls (Backend::take_launch_times), added up.
struct LaunchTotals {
  std::string what;
  int64_t launches = 0;
  double total_ms = 0.0;
};

// Every call of one label, added up.
struct OpTotals {
  std::string op;
  int64_t calls = 0;
  double flops = 0.0, bytes = 0.0;  // over all calls
  bool fp8 = false, host_copy = false;
  double total_ms = 0.0;  // measured time over all calls (0 where nothing was run)
  double pass_bytes = 0.0;  // of `bytes`, those moved by passes of their own (OpWork)
  std::vector<LaunchTotals> launches = {};  // where the back-end timed them: most time first
};

class OpLedger {
 public:
  // One call, with the device work the back-end timed inside it.
  void add(const OpWork& work, double ms = 0.0, const std::vector<LaunchTime>& launches = {});
  void add(const OpTotals& totals);  // calls added up elsewhere
  // Each label once; most measured time first, labels in order among equal times.
  std::vector<OpTotals> totals() const;
  void clear() { entries_.clear(); }

 private:
  std::map<std::string, OpTotals> entries_;
};

// The rates no op can exceed on a device: matrix products and attention in the run's precision,
// fp8 products, and memory (TFLOP/s, TFLOP/s, GB/s).
struct DeviceLimits {
  double tflops = 0.0, fp8_tflops = 0.0, bandwidth_gb_per_s = 0.0;
};

// The least milliseconds `totals` can take at `limits`: its FLOPs at the product rate or the bytes
// they overlap at the memory bandwidth, whichever is longer (the roofline model, Williams,
// Waterman and Patterson 2009), then its passes' bytes at the memory bandwidth. Requires the limits
// the work needs to be positive, and device work (!totals.host_copy).
double roofline_ms(const OpTotals& totals, const DeviceLimits& limits);
// Whether the FLOPs, not the bytes they overlap, set that bound.
bool compute_bound(const OpTotals& totals, const DeviceLimits& limits);

}  // namespace kiln
