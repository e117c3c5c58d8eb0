// Argument checks shared by the back-ends' op implementations: every op validates dtype, device
// and shape of its inputs and throws a kiln::Error naming the op and the argument.
#pragma once

#include "kiln/backend/ops.h"
#include "kiln/core/error.h"
#include "kiln/core/tensor.h"

namespace kiln::checks {

inline void require(const Tensor& tensor, DType dtype, Device device, const char* op, const char* arg) {
  KILN_CHECK(!tensor.empty(), "{}: argument '{}' is missing", op, arg);
  KILN_CHECK(tensor.device == device, "{}: argument '{}' is in {} memory, expected {}", op, arg,
             tensor.device == Device::CPU ? "host" : "CUDA device",
             device == Device::CPU ? "host" : "CUDA device");
  KILN_CHECK(tensor.dtype == dtype, "{}: argument '{}' has dtype {}, expected {}", op, arg,
             dtype_name(tensor.dtype), dtype_name(dtype));
}

inline bool is_floating(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }
inline bool is_fp8(DType dtype) { return dtype == DType::F8E4M3 || dtype == DType::F8E5M2; }

// The op's compute dtype, read from its leading activation `tensor`: fp32, bf16 or fp16.
inline DType compute_dtype(const Tensor& tensor, Device device, const char* op, const char* arg) {
  KILN_CHECK(!tensor.empty(), "{}: argument '{}' is missing", op, arg);
  KILN_CHECK(is_floating(tensor.dtype), "{}: argument '{}' has dtype {}, expected fp32, bf16 or fp16", op, arg,
             dtype_name(tensor.dtype));
  require(tensor, tensor.dtype, device, op, arg);
  return tensor.dtype;
}

inline void require_numel(const Tensor& tensor, int64_t numel, const char* op, const char* arg) {
  KILN_CHECK(tensor.numel() == numel, "{}: argument '{}' has {} elements {}, expected {}", op, arg,
             tensor.numel(), tensor.shape.to_string(), numel);
}

struct MatmulDims {
  int64_t M, K, N;
};

// Inner K and outputs N of a matmul from its weight (ops.h layouts); M is left 0.
inline MatmulDims matmul_weight_dims(const Tensor& weight, WeightLayout layout, const char* op) {
  KILN_CHECK(weight.shape.rank == 2, "{}: weight must be 2-D, got {}", op, weight.shape.to_string());
  const bool in_out = layout == WeightLayout::InOut;
  return {0, weight.shape[in_out ? 0 : 1], weight.shape[in_out ? 1 : 0]};
}

// Rows M, inner K and outputs N of a matmul from its input and weight.
inline MatmulDims matmul_dims(const Tensor& in, const Tensor& weight, WeightLayout layout, const char* op) {
  MatmulDims dims = matmul_weight_dims(weight, layout, op);
  KILN_CHECK(dims.K > 0 && in.numel() % dims.K == 0, "{}: input {} is not a multiple of K={}", op,
             in.shape.to_string(), dims.K);
  dims.M = in.numel() / dims.K;
  return dims;
}

// The same from the product's output (or its gradient) [M, N] instead of its input.
inline MatmulDims matmul_dims_from_output(const Tensor& out, const Tensor& weight, WeightLayout layout,
                                          const char* op) {
  MatmulDims dims = matmul_weight_dims(weight, layout, op);
  KILN_CHECK(dims.N > 0 && out.numel() % dims.N == 0, "{}: output {} is not a multiple of N={}", op,
             out.shape.to_string(), dims.N);
  dims.M = out.numel() / dims.N;
  return dims;
}

struct AttentionShape {
  int64_t B, T, C, NH, HS;
};

inline AttentionShape attention_shape(const Tensor& qkv, int num_heads, const char* op) {
  KILN_CHECK(qkv.shape.rank == 3 && qkv.shape[2] % 3 == 0, "{}: qkv must be [B, T, 3C], got {}", op,
             qkv.shape.to_string());
  const int64_t C = qkv.shape[2] / 3;
  KILN_CHECK(num_heads > 0 && C % num_heads == 0, "{}: {} heads do not divide {} channels", op, num_heads, C);
  return {qkv.shape[0], qkv.shape[1], C, num_heads, C / num_heads};
}

}  // namespace kiln::checks
