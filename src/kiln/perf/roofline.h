// The least time one training iteration can take on a GPU, op by op (the roofline model,
// Williams, Waterman and Patterson 2009): each op of the iteration, listed by running kiln's own
// model and optimizer on the op counter (backend/op_counting.h), takes at least its FLOPs at the
// device's product rate or its bytes at its memory bandwidth (backend/op_work.h), and the ops run
// one after another. The sum is a bound no implementation beats on that device; a measured step
// divided into it says how much of the hardware a run uses, and the per-op rows say where the rest
// goes (`kiln bench train --profile-ops` prints each op's measured share of its bound).
//
// The model is any ModelArchitecture's (nn/model.h), built on the op counter and run through the
// Model interface as the Trainer runs it, so GPT and the encoder classifier are counted alike.
// Counted: every op of `accumulation` micro-batches' forward and backward (recomputation, dropout
// and fp8 casts included) and the once-per-iteration gradient norm, AdamW over every parameter and
// fp8 scale update, as Trainer::train_step issues them; with the optimizer state sharded over
// data-parallel GPUs (ZeRO), each GPU's norm and AdamW cover its share. Not counted: host-to-device
// copies (staged on their own stream), gradient communication between GPUs, and whatever scratch
// traffic an implementation adds beyond op_work.h's least bytes.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/backend/op_work.h"
#include "kiln/core/dtype.h"
#include "kiln/nn/fp8_scaling.h"
#include "kiln/nn/model.h"
#include "kiln/nn/recompute.h"
#include "kiln/perf/gpu_specs.h"
#include "kiln/train/config.h"

namespace kiln {

// One GPU's share of an iteration: `accumulation` micro-batches of `micro_batch` x `seq` tokens
// of the model `architecture` describes (required; shared, since the shape is copied freely).
struct IterationShape {
  std::shared_ptr<const ModelArchitecture> architecture;
  int64_t micro_batch = 1, seq = 1, accumulation = 1;
  DType dtype = DType::F32;  // compute dtype (the Config's: fp32 also for TF32)
  RecomputePolicy recompute;
  std::optional<Fp8Recipe> fp8;
  int64_t optimizer_shards = 1;  // GPUs the optimizer state is split over (ZeRO stage >= 1)
  int64_t loss_chunk_rows = kDefaultLogitRows;  // positions the classifier and loss take at a time
};

// A resolved training Config's iteration on one of its data-parallel GPUs.
IterationShape iteration_shape(const Config& config);

// Every op of one iteration with its calls and work, without running any (the ledger's order).
// Fails naming what the model refuses (fp8 products, recomputation) as building it would.
std::vector<OpTotals> count_iteration_ops(const IterationShape& shape);

// The datasheet's rates for a precision name (fp32, tf32, bf16, fp16): its dense tensor-core
// TFLOP/s (CUDA-core for fp32), the fp8 rate, and the memory bandwidth. Fails naming the GPU where
// the datasheet has no rate for the precision.
DeviceLimits datasheet_limits(const GpuSpec& gpu, std::string_view precision);
// The same for a GPU that may be unknown: nullopt without a datasheet or without its precision.
std::optional<DeviceLimits> datasheet_limits_if_any(const std::optional<GpuSpec>& gpu,
                                                    std::string_view precision);

struct RooflineOp {
  OpTotals totals;
  double ms = 0.0;  // roofline_ms(totals, limits)
  bool compute_bound = false;
};

struct Roofline {
  DeviceLimits limits;
  std::vector<RooflineOp> ops;  // most time first
  double ms = 0.0;              // the whole iteration
  double compute_bound_ms = 0.0, memory_bound_ms = 0.0;
};

Roofline roofline(const std::vector<OpTotals>& ops, const DeviceLimits& limits);

}  // namespace kiln
