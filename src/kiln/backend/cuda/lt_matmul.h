// Every matrix product of the CUDA back-end, through cuBLASLt: one handle and one workspace for the
// back-end's life, and a plan (descriptors and the heuristic's algorithm) cached per shape, so a
// training step queries the heuristic only on its first pass. Products are row-major with fp32
// accumulation; the epilogues fuse the passes around a product that would otherwise read or write
// its output again: bias add, bias + GELU (keeping the pre-activation), the GELU derivative, and
// the bias gradient.
//
// Determinism: one plan per (shapes, types, epilogue, pointer alignments), so a product that
// recurs on the same buffers runs the same algorithm and gives the same bits. With autotune, the
// plan's algorithm is the fastest of the heuristic's first kTuningCandidates as timed at the plan's
// first repeatable call (lt_matmul_tuning.h): each run still uses one algorithm throughout, but
// which one can differ between runs, and so can the rounding. The activation arena aligns to 256
// bytes (core/arena.h), the most any cuBLASLt kernel asks for.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// Types of one product: A and B in `inputs`, C/D in `output` (the same, or fp32 for parameter
// gradients), accumulation in fp32; fp32 inputs use TF32 tensor cores only when `tf32`. fp8
// inputs (compute capability 8.9 and newer): E4M3 or E5M2, B's in `b_inputs` when it differs from
// A's (not both E5M2), A [M,K] and B [N,K], both K-contiguous (trans_a false, trans_b true:
// cuBLASLt's only fp8 layout), and a bf16, fp16 or fp32 output.
struct GemmTypes {
  DType inputs = DType::F32, output = DType::F32;
  bool tf32 = false;
  std::optional<DType> b_inputs = std::nullopt;
  DType b() const { return b_inputs.value_or(inputs); }
};

enum class GemmEpilogue : uint8_t {
  None,
  Bias,           // C[m, :] += bias (bias: [N] in the output dtype)
  GeluAuxBias,    // aux = C + bias (the pre-activation, [M, N] row stride aux_ld), C = gelu(aux)
  Dgelu,          // C = (alpha op(A) op(B)) * gelu'(aux), aux [M, N] row stride aux_ld; beta must be 0
  BiasGradFromB,  // bias_grad[n] = sum_k op(B)[k, n] (written, fp32 output only): the bias gradient
                  // when op(B) is the output gradient
  BiasGradFromA,  // bias_grad[m] = sum_k op(A)[m, k], likewise when op(A) is
};

// Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, with row strides lda, ldb, ldc and, for
// batch > 1, element strides between consecutive matrices of the batch. With `addend`, beta's C is
// read from there instead (same type and layout), and C is only written (cuBLASLt's C apart from D).
struct Gemm {
  GemmTypes types;
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  void* C = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  GemmEpilogue epilogue = GemmEpilogue::None;
  const void* bias = nullptr;  // Bias, GeluAuxBias
  void* bias_grad = nullptr;   // BiasGradFromA/B
  void* aux = nullptr;         // GeluAuxBias (written), Dgelu (read)
  int64_t aux_ld = 0;
  // fp8 inputs: device pointers to fp32 factors the product of A (and of B) is multiplied by, the
  // inverse of the scale each was cast with; null: 1. 16-byte aligned: on an H100 (cuBLAS 13.0,
  // 2026-11-25) every fp8 product of a training step was refused when run
  // (CUBLAS_STATUS_NOT_SUPPORTED) with its factors 4 bytes into 16, while the same forms with
  // factors in allocations of their own ran (inferred, not documented). run() refuses others by name.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  // fp8 inputs only: cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM), which does not
  // promote the tensor cores' partial sums to fp32 at intervals: faster, less exact. The fp8
  // recipes of Transformer Engine and torchao take it for the forward products only.
  bool fast_accumulation = false;
  const void* addend = nullptr;  // the C beta multiplies, when it is not the output; null: C
};

class LtMatmul {
 public:
  // `workspace` is device memory the products may use, owned by the caller for this object's life.
  // `autotune`: choose each plan's algorithm by timing (above) instead of taking the heuristic's first.
  LtMatmul(void* workspace, size_t workspace_bytes, bool autotune = false);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Issues the product on the compute stream (stream.h). Returns false, having run nothing, when
  // cuBLASLt has no algorithm for this epilogue with these shapes, types and alignments (the caller
  // then does the epilogue's work itself); throws kiln::Error when even the plain product has none,
  // or when a scale factor is less than 16-byte aligned.
  bool run(const Gemm& gemm);

  // Plans made so far: with an epilogue that cuBLASLt took, with one it had no algorithm for; with
  // autotune, those whose candidates were timed, those that took another algorithm than the
  // heuristic's first, and the largest gain that brought (the first's time over the kept one's); of
  // fp8 inputs, and of those with fast accumulation.
  struct PlanCounts {
    int64_t fused = 0, fell_back = 0, plain = 0;
    int64_t timed = 0, changed = 0;
    double best_speedup = 1.0;
    int64_t fp8 = 0, fast_accumulation = 0;
  };
  PlanCounts plan_counts() const;

  // With autotune: how many of the heuristic's algorithms are timed, the rounds each is timed for
  // after its warm-up, and by how much (a fraction) one must beat the heuristic's first to replace it.
  static constexpr int kTuningCandidates = 8;
  static constexpr int kTuningRounds = 3;
  static constexpr float kTuningMargin = 0.02f;

  // The workspace cuBLASLt gets: the size the cuBLAS documentation recommends for Hopper
  // (cublasSetWorkspace()).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  struct Plan;
  using PlanKey = std::vector<int64_t>;
  Plan& plan_for(const Gemm& gemm);
  // Issues `g` with the plan's algorithm `index` (the heuristic's order) on the compute stream, the
  // plan's descriptor carrying g's pointers; returns the cublasStatus_t.
  int launch(const Plan& plan, size_t index, const Gemm& g);
  // Times the plan's candidates on `g` (which must repeat exactly) and keeps the fastest.
  void choose_by_timing(Plan& plan, const Gemm& g);
  bool autotune_ = false;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace kiln::cuda
