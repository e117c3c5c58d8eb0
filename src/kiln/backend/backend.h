// Backend: the narrow table every compute device implements (ggml's back-end idea): memory,
// copies, and one method per op in ops.h. Layers, the optimizer and the trainer call only this.
//
// Contract for implementers: validate shapes and dtypes of the arguments and throw kiln::Error
// on a mismatch; never allocate inside an op (scratch comes in the arguments); be deterministic
// for a given thread count, unless an option says otherwise (BackendOptions::deterministic_attention
// off, matmul_autotune on). The CPU back-end is the reference every other one is tested against.
// A Backend is used from one host thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/batch_stager.h"
#include "kiln/backend/launch_time.h"
#include "kiln/backend/ops.h"

namespace kiln {

// Choices a back-end is made with (registry.h); the CPU back-end has none of these modes.
struct BackendOptions {
  bool tf32 = false;            // CUDA: fp32 matrix products on TF32 tensor cores
  bool fused_attention = true;  // CUDA: fused attention kernels where they apply (bf16/fp16, head
                                // size up to 256); off: T x T scores through cuBLASLt
  bool matmul_epilogues = true; // CUDA: bias, GELU and bias gradients inside the cuBLASLt products
                                // where it has algorithms for them; off: separate kernels
  bool warpgroup_attention = false;  // CUDA: the tensor-core attention kernels on wgmma where the
                                     // GPU and build have it (H100/H200, sm_90a); off: mma.sync,
                                     // which measured faster on the H100 (bench/NOTES.md, 2026-11-25)
  bool deterministic_attention = true;  // CUDA: the tensor-core attention backward in two kernels,
                                        // each gradient written by one block (the same bits every
                                        // run); off: one kernel adding dQ in fp32 atomics (fewer
                                        // products, run-to-run rounding differences in dQ)
  bool matmul_autotune = false;  // CUDA: each product shape's cuBLASLt algorithm the fastest of the
                                 // heuristic's first few, timed at its first call (the algorithm,
                                 // and so the rounding, can differ between runs); off: the heuristic's first
  bool fp8_fast_accumulation = true;  // CUDA: fp8 forward products accumulate without promoting their
                                      // partial sums to fp32 at intervals (cuBLASLt's fast accumulation:
                                      // faster, less exact); the backward's always promote
  bool cudnn_attention = false;  // CUDA: the fused attention on cuDNN's flash-attention engines where
                                 // they take the call (cuda/cudnn_attention.h); making the back-end
                                 // fails if cuDNN 9 cannot be loaded; off: kiln's own kernels
  int device_index = 0;  // CUDA: the GPU this process runs on (a data-parallel rank's local rank)
};

// Ops recorded by Backend::capture, replayed as one unit: replay() issues exactly the work the ops
// issued while they were recorded, with the same arguments and device addresses, so it computes
// what calling them again would, on whatever those addresses hold when it runs.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual void replay() = 0;
};

// Device memory owned by a back-end; freed when the buffer is destroyed.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  // e.g. "NVIDIA H100 80GB HBM3", "cpu, 2 threads, OpenBLAS Haswell kernels"
  virtual std::string description() const = 0;
  // What the back-end chose at run time that a measurement should be read with (for CUDA: how many
  // cuBLASLt products took their epilogue and how many fell back to kernels, and which attention
  // kernels the calls took); empty if nothing.
  virtual std::string run_notes() const { return {}; }

  // Memory. allocate() fails with a kiln::Error that names the size and what is free.
  virtual std::unique_ptr<DeviceBuffer> allocate(size_t bytes) = 0;
  virtual void copy_to_device(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // The bytes held in buffers from allocate() now, and the most held at once since the back-end
  // was made.
  virtual size_t allocated_bytes() const = 0;
  virtual size_t peak_allocated_bytes() const = 0;
  // Free and total bytes of the device as its driver reports them (GPU memory, including what
  // other libraries and the context hold); nullopt for host memory, which the OS manages.
  struct DeviceMemory {
    size_t free = 0, total = 0;
  };
  virtual std::optional<DeviceMemory> device_memory() const = 0;
  // Allocates now the scratch the ops of a model need, so training never allocates after the
  // first step; returns the bytes the back-end holds as workspace. Ops called with larger shapes
  // grow it themselves.
  struct WorkspaceNeeds {  // the largest calls the model makes
    int64_t batch = 0, seq = 0, heads = 0, head_size = 0;
    DType dtype = DType::F32;      // the compute dtype
    int64_t widest_row = 0;        // the most columns a bias gradient sums over rows (a bias's N)
    size_t fp8_cast_bytes = 0;     // most fp8_cast_bytes() (fp8_workspace.h) of one fp8 product
    int64_t widest_layernorm = 0;  // the most columns a LayerNorm normalises (layernorm_workspace.h)
  };
  virtual size_t reserve_workspace(const WorkspaceNeeds& needs) = 0;
  // What reserve_workspace(needs) would hold, without allocating (memory pre-flight checks).
  virtual size_t workspace_bytes(const WorkspaceNeeds& needs) const = 0;
  // Records the ops that `ops` calls, without running them, into a graph to replay (CUDA graphs:
  // one launch for hundreds of kernels). Null where the back-end has no graphs; then nothing was
  // recorded or run. While recording, the ops must not copy to or from the host, synchronise or
  // grow their workspace: run them once before capturing (a failure names the capture).
  virtual std::unique_ptr<OpGraph> capture(const std::function<void()>& ops) {
    (void)ops;
    return nullptr;
  }
  // Profiling (--profile-ops, op_timing.h): while launch timing is on, the back-end times on the
  // device each piece of work it issues inside an op (a kernel, a library's product or attention
  // call); take_launch_times() waits for them and hands over those issued since it was last called,
  // in issue order. A back-end that cannot (the CPU's: its ops are their own work) hands over none.
  virtual void set_launch_timing(bool on) { (void)on; }
  virtual std::vector<LaunchTime> take_launch_times() { return {}; }
  // Input batches to the device, overlapped with compute (batch_stager.h).
  virtual std::unique_ptr<BatchStager> make_batch_stager(const StagerOptions& options) = 0;

  // Benchmark hook for `kiln bench gemm`: median milliseconds of C[M,N] = A[M,K] B[K,N] on random
  // data, with inputs in `dtype` (F32, BF16 or F16) and fp32 accumulation; `tf32` selects TF32
  // tensor cores for F32 where the device has them. F8E4M3 (GPUs of compute capability 8.9 and
  // newer): B is stored [N, K], the only fp8 layout cuBLASLt has, and C is bf16.
  virtual double time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K, int iterations) = 0;

  // Ops (ops.h).
  virtual void embedding_forward(const EmbeddingForward& args) = 0;
  virtual void embedding_backward(const EmbeddingBackward& args) = 0;
  virtual void layernorm_forward(const LayerNormForward& args) = 0;
  virtual void layernorm_backward(const LayerNormBackward& args) = 0;
  virtual void matmul_forward(const MatmulForward& args) = 0;
  virtual void matmul_backward(const MatmulBackward& args) = 0;
  virtual void gelu_forward(const GeluForward& args) = 0;
  virtual void gelu_backward(const GeluBackward& args) = 0;
  virtual void tanh_forward(const TanhForward& args) = 0;
  virtual void tanh_backward(const TanhBackward& args) = 0;
  virtual void gather_rows(const GatherRows& args) = 0;
  virtual void gather_rows_backward(const GatherRowsBackward& args) = 0;
  virtual void mask_rows(const MaskRows& args) = 0;
  virtual void attention_forward(const AttentionForward& args) = 0;
  virtual void attention_backward(const AttentionBackward& args) = 0;
  virtual void softmax_cross_entropy(const SoftmaxCrossEntropy& args) = 0;
  virtual void adamw_step(const AdamwStep& args) = 0;
  virtual void fp8_update_scales(const Fp8UpdateScales& args) = 0;
  virtual double sum_of_squares(const SumOfSquares& args) = 0;
  virtual void dropout(const Dropout& args) = 0;
  virtual void fill(const Fill& args) = 0;
  virtual void convert(const Convert& args) = 0;
};

}  // namespace kiln
