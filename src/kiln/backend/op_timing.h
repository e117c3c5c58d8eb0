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

#include "kiln/backend/backend.h"
#include "kiln/backend/op_work.h"

namespace kiln {

class OpTimingBackend final : public Backend {
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

  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  std::string description() const override { return inner_->description(); }
  std::string run_notes() const override { return inner_->run_notes(); }
  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void synchronize() override { inner_->synchronize(); }
  size_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  size_t peak_allocated_bytes() const override { return inner_->peak_allocated_bytes(); }
  std::optional<DeviceMemory> device_memory() const override { return inner_->device_memory(); }
  size_t reserve_workspace(const WorkspaceNeeds& needs) override {
    return inner_->reserve_workspace(needs);
  }
  size_t workspace_bytes(const WorkspaceNeeds& needs) const override {
    return inner_->workspace_bytes(needs);
  }
  std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) override {
    return inner_->make_batch_stager(options);
  }
  double time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K,
                      int iterations) override {
    return inner_->time_gemm_ms(dtype, tf32, M, N, K, iterations);
  }

  void embedding_forward(const EmbeddingForward& args) override;
  void embedding_backward(const EmbeddingBackward& args) override;
  void layernorm_forward(const LayerNormForward& args) override;
  void layernorm_backward(const LayerNormBackward& args) override;
  void matmul_forward(const MatmulForward& args) override;
  void matmul_backward(const MatmulBackward& args) override;
  void gelu_forward(const GeluForward& args) override;
  void gelu_backward(const GeluBackward& args) override;
  void attention_forward(const AttentionForward& args) override;
  void attention_backward(const AttentionBackward& args) override;
  void softmax_cross_entropy(const SoftmaxCrossEntropy& args) override;
  void adamw_step(const AdamwStep& args) override;
  double sum_of_squares(const SumOfSquares& args) override;
  void fp8_update_scales(const Fp8UpdateScales& args) override;
  void fill(const Fill& args) override;
  void convert(const Convert& args) override;

 private:
  // Runs `call`, waits for the device, and adds the wall time, `work` and the device work timed
  // inside it to the ledger.
  template <typename Call>
  auto timed(const OpWork& work, Call call);
  std::unique_ptr<Backend> inner_;
  OpLedger ledger_;
};

}  // namespace kiln
