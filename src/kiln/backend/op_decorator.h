// OpDecorator: a Backend that forwards every call to another one and passes each op and host copy
// through around(), for decorators that watch the ops without changing them: the per-op timer
// (op_timing.h) and the step trace's recorder (op_tracing.h). Memory, workspace, staging and the
// GEMM benchmark go straight to the inner back-end. Graph capture is not forwarded (a decorator
// sees no op of a replay, so both refuse graphs) and neither is launch timing, which the
// decorators drive themselves through inner().
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kiln/backend/backend.h"
#include "kiln/backend/op_work.h"

namespace kiln {

class OpDecorator : public Backend {
 public:
  explicit OpDecorator(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  std::string description() const override { return inner_->description(); }
  std::string run_notes() const override { return inner_->run_notes(); }
  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) final;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) final;
  void synchronize() override { inner_->synchronize(); }
  size_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  size_t peak_allocated_bytes() const override { return inner_->peak_allocated_bytes(); }
  std::optional<DeviceMemory> device_memory() const override { return inner_->device_memory(); }
  size_t reserve_workspace(const WorkspaceNeeds& needs) override { return inner_->reserve_workspace(needs); }
  size_t workspace_bytes(const WorkspaceNeeds& needs) const override { return inner_->workspace_bytes(needs); }
  std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) override {
    return inner_->make_batch_stager(options);
  }
  double time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K, int iterations) override {
    return inner_->time_gemm_ms(dtype, tf32, M, N, K, iterations);
  }

  void embedding_forward(const EmbeddingForward& args) final;
  void embedding_backward(const EmbeddingBackward& args) final;
  void layernorm_forward(const LayerNormForward& args) final;
  void layernorm_backward(const LayerNormBackward& args) final;
  void matmul_forward(const MatmulForward& args) final;
  void matmul_backward(const MatmulBackward& args) final;
  void gelu_forward(const GeluForward& args) final;
  void gelu_backward(const GeluBackward& args) final;
  void tanh_forward(const TanhForward& args) final;
  void tanh_backward(const TanhBackward& args) final;
  void gather_rows(const GatherRows& args) final;
  void gather_rows_backward(const GatherRowsBackward& args) final;
  void mask_rows(const MaskRows& args) final;
  void attention_forward(const AttentionForward& args) final;
  void attention_backward(const AttentionBackward& args) final;
  void softmax_cross_entropy(const SoftmaxCrossEntropy& args) final;
  void adamw_step(const AdamwStep& args) final;
  double sum_of_squares(const SumOfSquares& args) final;
  void fp8_update_scales(const Fp8UpdateScales& args) final;
  void dropout(const Dropout& args) final;
  void fill(const Fill& args) final;
  void convert(const Convert& args) final;

 protected:
  // Runs one op or host copy: `run` makes the inner back-end's call, once; `work` describes it
  // (work_of: the label, FLOPs and bytes) and is worth calling only when the decorator uses it.
  virtual void around(const std::function<OpWork()>& work, const std::function<void()>& run) = 0;
  Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace kiln
