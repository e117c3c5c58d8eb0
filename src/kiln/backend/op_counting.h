// OpCountingBackend: a Backend that runs nothing and counts the work of every op it is given
// (op_work.h), so the ops of a training step can be listed, with their FLOPs and bytes, for a model
// of any size on a machine that could not hold it (perf/roofline.h). It validates each op's
// arguments as a CUDA back-end would (op_checks.h) and hands out device addresses that own no
// memory: nothing may read or write them. Copies to and from the device do nothing and are not
// counted (a step stages its batches over the host link, overlapped with compute);
// sum_of_squares returns 0. The ledger starts empty; clear it after setting a model up.
#pragma once

#include <memory>

#include "kiln/backend/backend.h"
#include "kiln/backend/memory_tracker.h"
#include "kiln/backend/op_work.h"

namespace kiln {

class OpCountingBackend final : public Backend {
 public:
  std::string_view name() const override { return "count"; }
  Device device() const override { return Device::CUDA; }
  std::string description() const override { return "op counter (runs nothing)"; }

  std::vector<OpTotals> totals() const { return ledger_.totals(); }
  void clear() { ledger_.clear(); }

  // Addresses 256-byte aligned and distinct for every live buffer, as cudaMalloc's are.
  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  void copy_to_device(void*, const void*, size_t) override {}
  void copy_to_host(void*, const void*, size_t) override {}
  void synchronize() override {}
  size_t allocated_bytes() const override { return memory_->current(); }
  size_t peak_allocated_bytes() const override { return memory_->peak(); }
  std::optional<DeviceMemory> device_memory() const override { return std::nullopt; }
  size_t reserve_workspace(const WorkspaceNeeds&) override { return 0; }
  size_t workspace_bytes(const WorkspaceNeeds&) const override { return 0; }
  // Both fail: the counter stages no data and times nothing.
  std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) override;
  double time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K,
                      int iterations) override;

  void embedding_forward(const EmbeddingForward& args) override;
  void embedding_backward(const EmbeddingBackward& args) override;
  void layernorm_forward(const LayerNormForward& args) override;
  void layernorm_backward(const LayerNormBackward& args) override;
  void matmul_forward(const MatmulForward& args) override;
  void matmul_backward(const MatmulBackward& args) override;
  void gelu_forward(const GeluForward& args) override;
  void gelu_backward(const GeluBackward& args) override;
  void tanh_forward(const TanhForward& args) override;
  void tanh_backward(const TanhBackward& args) override;
  void gather_rows(const GatherRows& args) override;
  void gather_rows_backward(const GatherRowsBackward& args) override;
  void mask_rows(const MaskRows& args) override;
  void attention_forward(const AttentionForward& args) override;
  void attention_backward(const AttentionBackward& args) override;
  void softmax_cross_entropy(const SoftmaxCrossEntropy& args) override;
  void adamw_step(const AdamwStep& args) override;
  void fp8_update_scales(const Fp8UpdateScales& args) override;
  double sum_of_squares(const SumOfSquares& args) override;
  void dropout(const Dropout& args) override;
  void fill(const Fill& args) override;
  void convert(const Convert& args) override;

 private:
  // Validates `args` with the shared check, as a back-end would, and adds their work.
  template <typename Args, typename Dims>
  void count(const Args& args, Dims (*check)(const Args&, Device)) {
    check(args, device());
    ledger_.add(work_of(args));
  }
  std::shared_ptr<MemoryTracker> memory_ = std::make_shared<MemoryTracker>();
  uintptr_t next_address_ = uintptr_t{1} << 40;  // far from any host allocation
  OpLedger ledger_;
};

}  // namespace kiln
