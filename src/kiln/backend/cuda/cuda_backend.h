// The CUDA back-end: every op on the GPU in fp32, bf16 and fp16 (ops.h dtypes), proven against the
// CPU reference by the op table. Matrix products go through cuBLASLt (lt_matmul.h: one handle, one
// workspace, plans cached per shape; fp32 accumulation; TF32 tensor cores for fp32 inputs only
// when constructed with tf32; parameter gradients written in fp32 from bf16/fp16 inputs), with
// bias, GELU and bias-gradient epilogues. The rest are the kernels of kernels.h, one .cu file per
// op family, templated on the storage type. Attention keeps the flash-attention contract (only the
// log-sum-exp is saved): fused tensor-core kernels where they apply (flash_attention.h), else the
// T x T matrices in a shared workspace through cuBLASLt. Everything runs on the compute stream
// (stream.h); copies wait for it. Compiled only in CUDA builds. Host code: the products in
// cuda_matmul.cpp, attention in cuda_attention.cpp, the rest in cuda_backend.cpp; what they share
// in cuda_backend_shared.h.
//
// Values inside device memory (token ids, targets) are not range-checked here: that would need a
// copy to the host per op. Gpt::forward checks them on the host before they are uploaded.
#pragma once

#include <memory>

#include "kiln/backend/backend.h"
#include "kiln/backend/memory_tracker.h"

namespace kiln {
namespace cuda {
struct Gemm;  // lt_matmul.h
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options = {});
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }
  std::string description() const override;
  std::string run_notes() const override;

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void synchronize() override;
  size_t allocated_bytes() const override { return memory_->current(); }
  size_t peak_allocated_bytes() const override { return memory_->peak(); }
  std::optional<DeviceMemory> device_memory() const override;
  size_t reserve_workspace(const WorkspaceNeeds& needs) override;
  size_t workspace_bytes(const WorkspaceNeeds& needs) const override;
  std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) override;
  std::unique_ptr<OpGraph> capture(const std::function<void()>& ops) override;  // op_graph.cpp
  void set_launch_timing(bool on) override;                                       // launch_timing.h
  std::vector<LaunchTime> take_launch_times() override;
  // How many graphs capture() made and how often they were replayed (run_notes() reports them).
  struct GraphCounts {
    int64_t captures = 0, replays = 0;
  };
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
  void* workspace(size_t bytes);  // the shared op scratch, grown to at least `bytes`
  size_t fixed_workspace_bytes() const;  // held from construction: cuBLASLt's and the norm's scratch
  void matmul_backward_fp8(const MatmulBackward& args, int64_t M, int64_t K, int64_t N);
  void input_gradient(const cuda::Gemm& product, const Tensor& gelu_in);
  void cast_din(const cuda::Gemm& product, const MatmulBackward& args, float* partials);
  struct Handles;
  std::shared_ptr<MemoryTracker> memory_ = std::make_shared<MemoryTracker>();
  // Shared with the graphs capture() returns.
  std::shared_ptr<GraphCounts> graph_counts_ = std::make_shared<GraphCounts>();
  std::unique_ptr<Handles> handles_;
};

}  // namespace kiln
