#include "kiln/perf/roofline.h"

#include <algorithm>

#include "kiln/backend/op_counting.h"
#include "kiln/core/error.h"
#include "kiln/optim/adamw.h"

namespace kiln {
namespace {

// `totals` with every call, FLOP and byte counted `times` times.
std::vector<OpTotals> repeated(std::vector<OpTotals> totals, int64_t times) {
  for (OpTotals& entry : totals) {
    entry.calls *= times;
    entry.flops *= static_cast<double>(times);
    entry.bytes *= static_cast<double>(times);
    entry.pass_bytes *= static_cast<double>(times);
  }
  return totals;
}

// The optimizer's ops on one of `shards` GPUs that split its state: a 1/shards share of the work.
std::vector<OpTotals> sharded(std::vector<OpTotals> totals, int64_t shards) {
  for (OpTotals& entry : totals)
    if (entry.op == "adamw_step" || entry.op == "sum_of_squares")
      entry.bytes /= static_cast<double>(shards);
  return totals;
}

}  // namespace

IterationShape iteration_shape(const Config& config) {
  IterationShape shape;
  shape.architecture = config.architecture();
  shape.micro_batch = config.micro_batch_size;
  shape.seq = config.seq_length;
  shape.accumulation = config.accumulation_steps();
  shape.dtype = config.compute_dtype();
  shape.recompute = config.recompute_policy();
  shape.fp8 = config.fp8_recipe();
  shape.loss_chunk_rows = config.loss_chunk_rows;
  return shape;
}

std::vector<OpTotals> count_iteration_ops(const IterationShape& shape) {
  KILN_CHECK(shape.micro_batch > 0 && shape.seq > 0 && shape.accumulation > 0 &&
                 shape.optimizer_shards > 0,
             "an iteration needs a positive micro-batch, sequence, accumulation and optimizer "
             "shards, got {} x {} x {} and {}",
             shape.micro_batch, shape.seq, shape.accumulation, shape.optimizer_shards);
  KILN_CHECK(shape.architecture != nullptr, "an iteration needs a model architecture");
  OpCountingBackend counter;
  const std::unique_ptr<Model> model = shape.architecture->build(counter, shape.dtype, 1);
  if (shape.fp8) model->enable_fp8(*shape.fp8);
  model->allocate_activations(shape.micro_batch, shape.seq, shape.recompute, shape.loss_chunk_rows);
  AdamW optimizer(counter, model->layout(), model->params(), AdamwConfig{});
  // Zero rows everywhere: the ops and their work depend on the shapes alone, and zeros are a valid
  // micro-batch of every model (GPT: token 0 predicting token 0; the encoder classifier: label 0
  // with only the first position real, data/classification_tokens.h).
  const std::vector<int32_t> rows(static_cast<size_t>(shape.micro_batch * shape.seq), 0);

  // The first micro-batch writes the gradients; the others issue the same ops adding to them:
  // count one of each and repeat the second.
  const auto count_micro_batch = [&](GradientPass gradients) {
    counter.clear();
    model->forward(MicroBatch{rows, rows, shape.micro_batch, shape.seq}, gradients);
    model->backward();
    return counter.totals();
  };
  const std::vector<OpTotals> first = count_micro_batch(GradientPass::Write);
  const std::vector<OpTotals> later =
      shape.accumulation > 1 ? repeated(count_micro_batch(GradientPass::Add), shape.accumulation - 1)
                             : std::vector<OpTotals>{};

  counter.clear();
  counter.sum_of_squares({model->grads()});
  optimizer.step(model->grads(), 1e-4f, 1.0f);
  if (model->fp8()) model->fp8()->update_scales(1);
  const std::vector<OpTotals> once = sharded(counter.totals(), shape.optimizer_shards);
  OpLedger iteration;
  for (const auto* part : {&first, &later, &once})
    for (const OpTotals& totals : *part) iteration.add(totals);
  return iteration.totals();
}

DeviceLimits datasheet_limits(const GpuSpec& gpu, std::string_view precision) {
  const DeviceLimits limits{gpu.peak_tflops(precision), gpu.fp8_tflops,
                            gpu.bandwidth_tb_per_s * 1e3};
  KILN_CHECK(limits.tflops > 0, "the {} datasheet gives no {} rate", gpu.key, precision);
  KILN_CHECK(limits.bandwidth_gb_per_s > 0, "the {} datasheet gives no memory bandwidth", gpu.key);
  return limits;
}

std::optional<DeviceLimits> datasheet_limits_if_any(const std::optional<GpuSpec>& gpu,
                                                    std::string_view precision) {
  if (!gpu || gpu->peak_tflops(precision) <= 0 || gpu->bandwidth_tb_per_s <= 0) return std::nullopt;
  return datasheet_limits(*gpu, precision);
}

Roofline roofline(const std::vector<OpTotals>& ops, const DeviceLimits& limits) {
  Roofline result;
  result.limits = limits;
  for (const OpTotals& totals : ops) {
    const RooflineOp op{totals, roofline_ms(totals, limits), compute_bound(totals, limits)};
    result.ms += op.ms;
    (op.compute_bound ? result.compute_bound_ms : result.memory_bound_ms) += op.ms;
    result.ops.push_back(op);
  }
  std::stable_sort(result.ops.begin(), result.ops.end(),
                   [](const RooflineOp& a, const RooflineOp& b) { return a.ms > b.ms; });
  return result;
}

}  // namespace kiln
