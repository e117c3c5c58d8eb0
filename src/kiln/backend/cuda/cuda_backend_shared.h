// What the CUDA back-end's op files share (cuda_backend.cpp, cuda_matmul.cpp,
// cuda_attention.cpp): the back-end's device state, the kernels' element kinds, element offsets and
// a product without epilogue. Host code only; included by those files alone.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>

#include "kiln/backend/cuda/cuda_backend.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/cudnn_attention.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/lt_matmul.h"
#include "kiln/core/error.h"

namespace kiln {

struct CudaBackend::Handles {
  std::unique_ptr<DeviceBuffer> matmul_workspace;
  std::unique_ptr<cuda::LtMatmul> matmul;  // every matrix product (lt_matmul.h)
  bool tf32 = false;
  bool matmul_epilogues = true;
  bool fused_attention = true;
  bool warpgroup_attention = false;  // asked for, and the device and build have it
  bool deterministic_attention = true;
  bool fp8_fast_accumulation = true;  // in the fp8 forward products (BackendOptions)
  int compute_major = 0, compute_minor = 0;  // the device's compute capability, read once
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention;  // with BackendOptions::cudnn_attention, else null
  std::array<int64_t, 4> attention_forward_calls{};  // by AttentionPath (cuda_attention.cpp), for run_notes()
  int64_t warpgroup_forward_calls = 0;               // of the Tiled ones, on wgmma
  int64_t tiled_backward_calls = 0, atomic_backward_calls = 0;  // of those, adding dQ atomically
  std::unique_ptr<DeviceBuffer> sum_scratch;  // kSumBlocks partials + the result
  // Scratch of the ops that need it, one at a time on the stream: embedding backward's sort,
  // attention's two B x NH x T x T matrices, the partial column sums of a parameter gradient, or a
  // bias gradient from a cuBLASLt epilogue. Sized by reserve_workspace() from WorkspaceNeeds;
  // grown by an op that needs more (never during planned training).
  std::unique_ptr<DeviceBuffer> workspace;
};

namespace cuda_backend {

constexpr Device kCuda = Device::CUDA;

inline int element_kind(DType dtype) {
  switch (dtype) {
    case DType::F32: return cuda::kFp32;
    case DType::BF16: return cuda::kBf16;
    case DType::F16: return cuda::kFp16;
    default: fail("the CUDA kernels take fp32, bf16 or fp16, not {}", dtype_name(dtype));
  }
}

// `elements` further into a tensor of `dtype` elements.
inline const void* at(const void* data, int64_t elements, DType dtype) {
  return static_cast<const char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}
inline void* at(void* data, int64_t elements, DType dtype) {
  return static_cast<char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}

// Which attention kernels take a call (attention_workspace.h): cuDNN's (cudnn_attention.h) where
// `cudnn` (it is on and takes the call's mask) and the dtype, head size and the tensors' 16-byte
// alignment suit them; else the tensor-core tiles (flash_attention.h) where the dtype, head size,
// GPU and alignment suit them, else the general fused kernels (general_attention.h), else the
// materialised scores; the fused paths only with fusion on and with a grid the fused kernels can
// address (B x NH blocks in y).
enum class AttentionPath { Tiled, General, Materialized, Cudnn };  // attention_forward_calls' order

AttentionPath attention_path(bool fused_on, bool cudnn, int compute_major, DType dtype, int64_t B, int64_t NH,
                             int64_t HS, std::initializer_list<const void*> tensors);  // cuda_attention.cpp

// A product without epilogue, arguments in Gemm's order (every cuBLASLt plan takes that).
inline void gemm(cuda::LtMatmul& lt, cuda::GemmTypes types, bool trans_a, bool trans_b, int64_t M, int64_t N,
                 int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                 int64_t ldc, int64_t batch = 1, int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_c = 0) {
  lt.run({types, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c});
}

}  // namespace cuda_backend
}  // namespace kiln
