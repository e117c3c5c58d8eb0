// The CPU back-end: the reference implementation of every op, written for clarity first and
// parallelised with OpenMP where it matters. Matrix products go through BLAS (OpenBLAS's sgemm):
// a tuned GEMM is the one piece that clearly beats writing our own for CPU training speed.
//
// Determinism: every reduction has a fixed order that does not depend on the thread count
// (column-parallel sums for parameter gradients, fixed-size chunks for norms), so two runs with
// the same inputs on one machine give the same bits. The loops run in the machine's widest
// vector unit (vector_math.h): elementwise ops give the same bits on every machine, while the
// products (OpenBLAS's kernels) and vectorized sums may differ between machines in the last bits.
// Ops are written in fp32; bf16/fp16 calls run the same code on widened copies and round the
// outputs (fp32_scope.h), which is the reference for low precision.
// Op definitions live one family per file: embedding.cpp, layernorm.cpp, matmul.cpp, gelu.cpp,
// tanh.cpp, gather_rows.cpp, mask_rows.cpp, attention.cpp, cross_entropy.cpp, elementwise.cpp,
// dropout.cpp, adamw.cpp, fp8_scaling.cpp.
// Not final: tests derive from it to watch the ops a model issues (tests/nn/product_inputs_test.cpp).
#pragma once

#include <initializer_list>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/fp32_scope.h"
#include "kiln/backend/memory_tracker.h"

namespace kiln {

class CpuBackend : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
  std::string description() const override;

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void synchronize() override {}
  size_t allocated_bytes() const override { return memory_->current(); }
  size_t peak_allocated_bytes() const override { return memory_->peak(); }
  std::optional<DeviceMemory> device_memory() const override { return std::nullopt; }
  // CPU ops keep their scratch per thread (attention) or in scratch_, grown on first use.
  size_t reserve_workspace(const WorkspaceNeeds&) override { return 0; }
  size_t workspace_bytes(const WorkspaceNeeds&) const override { return 0; }
  std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) override;
  double time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K, int iterations) override;

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
  // The reference meaning of GradStore::Write (ops.h): the op's Add into zeros. Zeroes `grads`
  // (empty ones skipped) when `store` is Write.
  void zero_to_write(GradStore store, std::initializer_list<Tensor> grads);

  // Shared with the buffers, which report their release to it.
  std::shared_ptr<MemoryTracker> memory_ = std::make_shared<MemoryTracker>();
  ConversionScratch scratch_;  // fp32 copies of bf16/fp16 arguments
};

}  // namespace kiln
