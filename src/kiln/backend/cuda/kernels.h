// Launchers of the CUDA back-end's own kernels, defined in one .cu file per op family (embedding,
// layernorm and layernorm_fp8, bias, gelu, tanh, gather_rows, mask_rows, dropout, elementwise,
// attention_softmax, cross_entropy, optimizer; the fused attention has its own header). Plain pointers and sizes only, no kiln
// headers, so nvcc compiles the .cu files without fmt; CudaBackend (cuda_backend.cpp) validates
// arguments and calls these.
// All pointers are device memory; every launcher issues its work on the compute stream (stream.h)
// and returns the launch status (cudaError_t as int, 0 on success).
//
// Each launcher has the semantics of the op of the same name in backend/ops.h; the reductions
// (parameter gradients, norms) use a fixed order, so results are deterministic.
// Dtypes follow ops.h: activation pointers are void* in the element kind `kind` (0 fp32, 1 bf16,
// 2 fp16), read into fp32, computed in fp32 and rounded once on store; LayerNorm statistics,
// losses and parameter gradients are float*.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/backend/dropout_mask.h"

namespace kiln::cuda {

enum ElementKind : int { kFp32 = 0, kBf16 = 1, kFp16 = 2 };

int embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int kind, int64_t B,
                      int64_t T, int64_t C);
// Needs a workspace of embedding_backward_workspace_bytes(B * T) bytes (positions sorted by token).
size_t embedding_backward_workspace_bytes(int64_t positions);
// dwte += always; dwpe += or, with write_dwpe, = for its first T rows and zero for the rest of its
// dwpe_rows (ops.h, EmbeddingBackward::dwpe_store).
int embedding_backward(float* dwte, float* dwpe, const void* dout, int kind, const int32_t* tokens, int64_t B,
                       int64_t T, int64_t C, int64_t dwpe_rows, bool write_dwpe, void* workspace,
                       size_t workspace_bytes);
int layernorm_forward(void* out, float* mean, float* rstd, const void* in, const void* weight, const void* bias,
                      int kind, int64_t M, int64_t C, float eps);
// The same LayerNorm with its output only cast (ops.h, LayerNormForward with fp8): E4M3 codes of the
// rounded output, times *scale, into codes [M, C] and codes_t [C, M] (unless null), max |output|
// into *amax, as cast_fp8 from layernorm_forward's output would give. M and C multiples of 16.
int layernorm_forward_fp8(uint8_t* codes, uint8_t* codes_t, float* mean, float* rstd, const void* in,
                          const void* weight, const void* bias, int kind, int64_t M, int64_t C, float eps,
                          const float* scale, float* amax);
// din += (write_din: =) the input gradient, dweight and dbias += (write_params: =) the parameter
// gradients, from one read of dout and in; needs a workspace of layernorm_backward_scratch_bytes(M,
// C) (layernorm_workspace.h) bytes.
int layernorm_backward(void* din, float* dweight, float* dbias, const void* dout, const void* in, const void* weight,
                       int kind, const float* mean, const float* rstd, int64_t M, int64_t C, bool write_din,
                       bool write_params, void* workspace);
// The same backward with din also cast for the next product's fp8 backward (ops.h, LayerNormBackward
// with fp8): the E4M3 (e4m3) or E5M2 codes of din as stored, times *scale, into codes [M, C] and
// codes_t [C, M], max |din| into *amax, and the column sums of din into product_dbias (+=, or =
// with write_params; or null), as cast_fp8 of layernorm_backward's din with column partials would
// give. M and C multiples of 16; needs layernorm_backward_scratch_bytes(M, C, true) bytes of workspace.
int layernorm_backward_fp8(void* din, float* dweight, float* dbias, float* product_dbias, const void* dout,
                           const void* in, const void* weight, int kind, const float* mean, const float* rstd,
                           int64_t M, int64_t C, bool write_din, bool write_params, const float* scale, float* amax,
                           bool e4m3, uint8_t* codes, uint8_t* codes_t, void* workspace);
// The bias gradient's column sums (sum_columns) need a workspace of
// column_sums_workspace_bytes(M, N) bytes for their per-chunk partial sums.
size_t column_sums_workspace_bytes(int64_t M, int64_t N);
// out[m, :] = row (+ addend[m, :] where addend is not null)
int broadcast_rows(void* out, const void* row, const void* addend, int kind, int64_t M, int64_t N);
// sums += (overwrite: =) sum_m in[m, :]
int sum_columns(float* sums, const void* in, int kind, int64_t M, int64_t N, void* workspace, bool overwrite);
int add_floats(float* sums, const float* values, int64_t count);  // sums += values
// sums[n] += (overwrite: =) partials[0][n] + ... + partials[chunks - 1][n], in an order that depends
// only on chunks.
int sum_column_partials(float* sums, const float* partials, int64_t chunks, int64_t N, bool overwrite);
int gelu_forward(void* out, const void* in, int kind, int64_t count);
int gelu_backward(void* din, const void* in, const void* dout, int kind, int64_t count);
int tanh_forward(void* out, const void* in, int kind, int64_t count);
int tanh_backward(void* din, const void* out, const void* dout, int kind, int64_t count);  // from tanh's output
// out [B, C] = in [B, T, C] at `position`; the backward's din [B, T, C] at `position` = dout (the
// other rows zeroed) with write, += dout (the other rows untouched) without.
int gather_rows(void* out, const void* in, int kind, int64_t B, int64_t T, int64_t C, int64_t position);
int gather_rows_backward(void* din, const void* dout, int kind, int64_t B, int64_t T, int64_t C, int64_t position,
                         bool write);
// out [M, C] = in where keep[m] != 0, else 0; out may alias in.
int mask_rows(void* out, const void* in, const int32_t* keep, int kind, int64_t M, int64_t C);
// Dropout's out = [residual +] (keep ? in * scale : 0), keep = philox::bits(seed, stream, i) >= threshold
// (ops.h); residual may be null.
int dropout(void* out, const void* in, const void* residual, int kind, int64_t count, uint64_t threshold, float scale,
            uint64_t seed, uint64_t stream);
int fill(void* out, int kind, float value, int64_t count);
int convert(void* out, int out_kind, const void* in, int in_kind, int64_t count);
// Attention's softmax under the flash-attention contract (ops.h). Scores are [B, NH, T, T], already
// scaled by 1/sqrt(HS); key_mask [B, T] or null.
// `dropout`: attention dropout's mask (ops.h, AttentionDropout; threshold 0: none).
// Forward: scores -> probabilities in place (with dropout P Z, the product's operand), and lse
// [B, NH, T] of the undropped ones (-inf for a query without keys).
int attention_softmax_forward(void* scores, float* lse, int kind, const int32_t* key_mask, int64_t B, int64_t NH,
                              int64_t T, bool causal, const DropoutMask& dropout);
// Backward: scores -> P = exp(s - lse) in place (with dropout P Z, for dv), and dP -> dS = P * (dP Z - D)
// * scale in place, with D = rowsum(dout * out) over the head's HS channels of dout and out ([B, T, NH * HS]).
int attention_softmax_backward(void* scores, void* dscores, const float* lse, const void* dout, const void* out,
                               int kind, const int32_t* key_mask, int64_t B, int64_t NH, int64_t T, int64_t HS,
                               bool causal, float scale, const DropoutMask& dropout);
int softmax_cross_entropy(void* logits, int kind, float* losses, const int32_t* targets, int64_t M, int64_t V,
                          int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad);
// The same with the gradient cast for the classifier's fp8 backward (ops.h, SoftmaxCrossEntropy with
// fp8): the gradient, rounded to the logits' type, as codes fp8(grad * *scale) (E4M3 when e4m3, else
// E5M2) into codes [M, Vp], and max |grad| into *amax; the logits are only read. M and Vp
// multiples of 16; the transpose comes from transpose_fp8.
int softmax_cross_entropy_fp8(const void* logits, int kind, float* losses, const int32_t* targets, int64_t M,
                              int64_t V, int64_t Vp, int32_t ignore_index, float loss_scale, const float* scale,
                              float* amax, bool e4m3, uint8_t* codes);
// AdamW (ops.h, AdamwStep) over the ranges, each with its weight decay, in as few launches as the
// ranges allow (one for up to 64 ranges); the bias corrections come as 1 / (1 - beta^step).
struct AdamwRange {
  int64_t offset = 0, count = 0;
  float weight_decay = 0.0f;
};
struct AdamwScalars {
  float lr, beta1, beta2, eps, grad_scale, inverse_correction1, inverse_correction2;
};
int adamw(float* master, void* param_out, int out_kind, const float* grad, float* exp_avg, float* exp_avg_sq,
          const AdamwRange* ranges, int64_t range_count, const AdamwScalars& scalars);
// fp8 casts of the fp8 products (ops.h): out[r, c] and/or out_t[c, r] (the transpose) =
// fp8(in[r, c] * *scale), E4M3 when e4m3 else E5M2, and *amax = max(*amax, max |in|); either output
// may be null; rows and cols multiples of 16, pointers 16-byte aligned. With column_partials (else
// null; fp8_bias_partials_bytes(rows, cols), fp8_workspace.h), also the column sums of `in` before
// the cast, in tile rows that sum_column_partials(sums, column_partials, fp8_cast_tile_rows(rows),
// cols, overwrite) adds into (or writes to) sums.
int cast_fp8(const void* in, int kind, int64_t rows, int64_t cols, const float* scale, float* amax, bool e4m3,
             uint8_t* out, uint8_t* out_t, float* column_partials = nullptr);
// codes_t [cols, rows] = the transpose of codes [rows, cols], one byte an element (fp8 codes); rows and
// cols multiples of 16, pointers 16-byte aligned.
int transpose_fp8(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t);
// The E4M3 cast of gelu(in) as the GELU op stores it (rounded to the input's type) instead of `in`
// (ops.h, MatmulForward with gelu_fp8, GeluForward with fp8): as cast_fp8 of gelu_forward's output
// would give, without column sums.
int cast_gelu_fp8(const void* in, int kind, int64_t rows, int64_t cols, const float* scale, float* amax,
                  uint8_t* out, uint8_t* out_t);
// cast_fp8 of dout times GELU's derivative at gelu_in, as gelu_backward would store it (rounded to
// the inputs' type), instead of dout (ops.h, MatmulBackward with gelu_in and din_reader, where the
// product could not apply the derivative): one pass where gelu_backward and cast_fp8 took two.
int cast_gelu_gradient_fp8(const void* dout, const void* gelu_in, int kind, int64_t rows, int64_t cols,
                           const float* scale, float* amax, bool e4m3, uint8_t* out, uint8_t* out_t,
                           float* column_partials);
// ops.h, Fp8UpdateScales: rows of [scale, scale_inv, amax, fp8_max, ...] with the history of
// `history` values from column history_column.
int fp8_update_scales(float* state, int64_t tensors, int64_t history_column, int64_t history, int64_t position,
                      bool use_history_max, int margin);
// Pseudo-random values in [-1, 1) from a hash of (seed, index).
int fill_random(void* out, int kind, int64_t count, uint64_t seed);
// Pseudo-random fp8 E4M3 codes of magnitude below 1 (never NaN), for the fp8 GEMM benchmark.
int fill_random_fp8_e4m3(uint8_t* out, int64_t count, uint64_t seed);
// Sum of squares in double with a fixed grid; `partials` holds kSumBlocks doubles of device memory.
constexpr int kSumBlocks = 512;
int sum_of_squares(const float* in, int64_t count, double* partials, double* result);

}  // namespace kiln::cuda
