// Fused attention on tensor cores (the flash-attention algorithm: Dao et al. 2022, Dao 2023) for
// bf16/fp16 on sm_80 and newer, head sizes that are multiples of 8 up to 128: the T x T scores
// never reach global memory. Same contract as the attention ops in backend/ops.h (lse saved,
// backward recomputes the probabilities from it, D = rowsum(dout * out)). Plain pointers only,
// like kernels.h. Other head sizes and GPUs: general_attention.h.
//
// Tiles of 64 queries x 64 keys, 64 or 128 channels wide (heads of 64 and 128 fill them; narrower
// heads, e.g. 24 or 80, are zero-padded to the next width); four warps; mma.sync products with
// every fragment in registers, fp32 accumulation and softmax statistics; streamed tiles
// double-buffered by cp.async (flash_tiles.cuh). Forward: flash_forward.cu. On an H100/H200 built
// with sm_90a code the products of both are wgmma instead of mma.sync (core_matrix_tiles.cuh). Backward
// (flash_backward.cu), deterministic: two kernels, one per key tile (dK, dV) and one per query tile
// (dQ), so every gradient element is written by one block in a fixed order, no atomics; or not
// deterministic: one kernel per key tile that also adds dQ into fp32 sums with atomic adds (two
// fewer products per pair of tiles), then a pass rounding the sums into dqkv. Attention dropout
// (ops.h, AttentionDropout) on every variant, its mask drawn inside the tiles (flash_tiles.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/backend/dropout_mask.h"

namespace kiln::cuda {

// Whether the tiled kernels take this storage type (kind, kernels.h) and head size, on any device.
bool tiled_attention_shape(int kind, int64_t head_size);
// Whether the tiled kernels handle this call: kind bf16 or fp16 (kernels.h), head size a multiple
// of 8 up to 128, on a device whose compute capability's major version is `compute_major` (the
// tiles need 8, sm_80, or newer). The pointers must be 16-byte aligned.
bool tiled_attention_applies(int kind, int64_t head_size, int compute_major);

// Whether the warpgroup kernels (wgmma, sm_90a: core_matrix_tiles.cuh) run on a device of this
// compute capability: 9.0, in a build with sm_90a code (KILN_CUDA_WGMMA, CMakeLists.txt).
bool warpgroup_attention_applies(int compute_major, int compute_minor);

// qkv [B, T, 3C] (q | k | v, heads contiguous), out [B, T, C], lse [B, NH, T] fp32,
// key_mask [B, T] or null; scale = 1 / sqrt(head size) (positive: the forward takes a row's
// maximum over unscaled scores, flash_forward.cu). `warpgroup` (forward and backward): the
// wgmma kernels (only where warpgroup_attention_applies), else mma.sync.
//
// fp8 codes an attention kernel writes for the next fp8 product (ops.h, the attention ops with
// fp8), of an [M, N] matrix (M = B*T): each element rounded to the storage type, x, as
// fp8(x * *scale) (E4M3 when e4m3, else E5M2) into rows [M, N] and columns [N, M] (the forward's
// may be null: not wanted), max |x|
// max-accumulated into *amax, and, unless column_partials is null, the column sums of each
// sequence's tiles of 64 positions into column_partials [B * ceil(T / 64), N] (row b * ceil(T / 64)
// + tile: attention_gradient_partial_rows, attention_workspace.h), for sum_column_partials
// (kernels.h). Pointers 16-byte aligned; M and N multiples of 16. The forward's output (N = C) for
// c_proj's forward, written besides `out`; the backward's dqkv (N = 3C) for c_attn's backward.
struct AttentionCodes {
  const float* scale = nullptr;
  float* amax = nullptr;
  bool e4m3 = false;
  uint8_t* rows = nullptr;
  uint8_t* columns = nullptr;
  float* column_partials = nullptr;
};
// `dropout`: attention dropout's mask (ops.h, AttentionDropout; threshold 0: none), the general
// kernels' (general_attention.h): element (query, key) of block row (b NH + h) is kept iff
// DropoutMask::factor(((b NH + h) T + query) T + key) is not 0. Forward: out = (P Z) v / l with the
// row maximum, l and lse of the undropped P (Z: 0 or 1 / (1 - p)). Backward: dv = (P Z)^T dout,
// dP = (dout v^T) Z, dS = P (dP - D) scale, D = rowsum(dout * out) (FlashAttention-2, Dao 2023,
// with FlashAttention's dropout, Dao et al. 2022 Algorithm 4). Kernels without the mask's code run
// when its threshold is 0.
//
// With `codes` (else null), out is written and cast (above; no column sums): dropped as out is.
int flash_attention_forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int kind, int64_t B,
                            int64_t T, int64_t NH, int64_t HS, bool causal, float scale, bool warpgroup,
                            const AttentionCodes* codes = nullptr, const DropoutMask& dropout = {});
// With `codes` (else null), dqkv is not written: its codes are (above). workspace: D, B * NH * T
// floats; unless `deterministic`, then dQ's sums at attention_query_sums_offset (B * T * NH * HS
// floats; attention_workspace.h). Deterministic: the same bits on every run; else dqkv's q part may
// differ in the last bits from run to run (the order of the atomic additions).
int flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                             const int32_t* key_mask, int kind, int64_t B, int64_t T, int64_t NH, int64_t HS,
                             bool causal, float scale, void* workspace, bool warpgroup, bool deterministic,
                             const AttentionCodes* codes = nullptr, const DropoutMask& dropout = {});

}  // namespace kiln::cuda
