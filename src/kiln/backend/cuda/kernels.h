// Launchers of the CUDA back-end's own kernels. Plain pointers and sizes only, no kiln headers,
// so nvcc (C++17) compiles the .cu files without fmt; CudaBackend (cuda_backend.cpp) validates
// arguments and calls these. All pointers are device memory; every launcher runs on the default
// stream and returns the launch status (cudaError_t as int, 0 on success).
//
// Each launcher has the semantics of the op of the same name in backend/ops.h; the reductions
// (parameter gradients, norms) use a fixed order, so results are deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

int embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int64_t B, int64_t T, int64_t C);
// Needs a workspace of embedding_backward_workspace_bytes(B * T) bytes (positions sorted by token).
size_t embedding_backward_workspace_bytes(int64_t positions);
int embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int64_t B, int64_t T, int64_t C, void* workspace, size_t workspace_bytes);
int layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                      const float* bias, int64_t M, int64_t C, float eps);
int layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                       const float* weight, const float* mean, const float* rstd, int64_t M, int64_t C);
int broadcast_rows(float* out, const float* row, int64_t M, int64_t N);  // out[m, :] = row
int column_sums_add(float* sums, const float* in, int64_t M, int64_t N); // sums += sum_m in[m, :]
int gelu_forward(float* out, const float* in, int64_t count);
int gelu_backward(float* din, const float* in, const float* dout, int64_t count);
int residual_forward(float* out, const float* a, const float* b, int64_t count);
int fill(float* out, float value, int64_t count);
// Scores [rows = B*NH*T, T] -> probabilities in place; key_mask [B, T] or null.
int masked_softmax(float* scores, const int32_t* key_mask, int64_t B, int64_t NH, int64_t T, bool causal);
// dP -> dS in place: dS = P * (dP - rowsum(P * dP)) * scale.
int softmax_backward(float* dscores, const float* probs, int64_t rows, int64_t T, float scale);
int softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t M, int64_t V,
                          int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad);
// out_kind: 0 fp32, 1 bf16, 2 fp16.
int adamw(float* master, void* param_out, int out_kind, const float* grad, float* exp_avg,
          float* exp_avg_sq, int64_t offset, int64_t count, float lr, float beta1, float beta2,
          float eps, float weight_decay, float grad_scale, float bias_correction1,
          float bias_correction2);
// Pseudo-random values in [-1, 1) from a hash of (seed, index); kind: 0 fp32, 1 bf16, 2 fp16.
int fill_random(void* out, int kind, int64_t count, uint64_t seed);
// Sum of squares in double with a fixed grid; `partials` holds kSumBlocks doubles of device memory.
constexpr int kSumBlocks = 512;
int sum_of_squares(const float* in, int64_t count, double* partials, double* result);

}  // namespace kiln::cuda
