// Fused attention on CUDA cores for what the tensor-core tiles (flash_attention.h) do not take:
// bf16/fp16 heads of any size up to 256 (not a multiple of 8, or wider than 128) and GPUs older
// than sm_80. The flash-attention algorithm (Dao et al. 2022; Dao 2023) with the same contract as
// the attention ops in backend/ops.h: the T x T scores are never stored, forward saves lse,
// backward recomputes the probabilities from it and uses D = rowsum(dout * out). Computed in fp32
// from the 16-bit inputs, rounded once on store. Plain pointers only, like kernels.h.
//
// Blocks of four warps own 16 rows (queries in forward and for dQ, keys for dK/dV), four per warp;
// each lane takes one of 32 keys (or queries) of a tile in shared memory for the dot products, and
// channels lane, lane + 32, ... of the rows' accumulators. Backward is two kernels (dQ per query
// block, dK/dV per key block), so every gradient element is written once: deterministic.
#pragma once

#include <cstdint>

#include "kiln/backend/dropout_mask.h"

namespace kiln::cuda {

constexpr int64_t kGeneralAttentionMaxHeadSize = 256;

// qkv [B, T, 3C] (q | k | v, heads contiguous), out [B, T, C], lse [B, NH, T] fp32, key_mask
// [B, T] or null; kind bf16 or fp16 (kernels.h); head size HS in [1, 256]; scale = 1 / sqrt(HS);
// `dropout`: attention dropout's mask (ops.h, AttentionDropout; threshold 0: none).
int general_attention_forward(void* out, float* lse, const void* qkv, const int32_t* key_mask, int kind, int64_t B,
                              int64_t T, int64_t NH, int64_t HS, bool causal, float scale,
                              const DropoutMask& dropout = {});
// workspace: B * NH * T floats (D).
int general_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                               const int32_t* key_mask, int kind, int64_t B, int64_t T, int64_t NH, int64_t HS,
                               bool causal, float scale, void* workspace, const DropoutMask& dropout = {});

// d[b, h, t] = sum over the head's HS channels of dout * out ([B, T, NH * HS] each, any kind): the
// D of both fused backward paths.
int attention_row_dots(float* d, const void* dout, const void* out, int kind, int64_t B, int64_t T, int64_t NH,
                       int64_t HS);

}  // namespace kiln::cuda
