// The CUDA back-end's attention core (ops.h, AttentionForward and AttentionBackward).
#include <cmath>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/fp8_workspace.h"
#include "kiln/backend/cuda/cuda_backend_shared.h"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

using cuda::check_cuda;
using cuda::GemmTypes;
using cuda_backend::at;
using cuda_backend::AttentionPath;
using cuda_backend::attention_path;
using cuda_backend::element_kind;
using cuda_backend::gemm;
using cuda_backend::kCuda;

static_assert(kMaxFusedAttentionHeadSize == cuda::kGeneralAttentionMaxHeadSize);

AttentionPath cuda_backend::attention_path(bool fused_on, bool cudnn, int compute_major, DType dtype, int64_t B,
                                           int64_t NH, int64_t HS, std::initializer_list<const void*> tensors) {
  if (!fused_on || !fused_attention_shape(dtype, HS)) return AttentionPath::Materialized;
  bool aligned = true;
  for (const void* data : tensors) aligned = aligned && reinterpret_cast<uintptr_t>(data) % 16 == 0;
  if (cudnn && aligned && cuda::cudnn_attention_head(HS)) return AttentionPath::Cudnn;
  if (B * NH > 65535) return AttentionPath::Materialized;
  if (!aligned) return AttentionPath::General;
  return cuda::tiled_attention_applies(element_kind(dtype), HS, compute_major) ? AttentionPath::Tiled
                                                                               : AttentionPath::General;
}

namespace {
// What every path takes from an attention op's mask and head size: the scores' scale
// 1 / sqrt(HS), whether later keys are hidden, and the key mask (null unless padding applies).
struct Masking {
  float scale;
  bool causal;
  const int32_t* key_mask;
};
template <typename AttentionOp>
Masking masking_of(const AttentionOp& a, int64_t HS) {
  const bool padded = a.mask != AttentionMask::Causal;
  return {1.0f / std::sqrt(static_cast<float>(HS)), a.mask != AttentionMask::KeyPadding,
          padded ? a.key_mask.template as<int32_t>() : nullptr};
}

// Whether cuDNN may take a call with this mask and dropout (it is on; key padding stays on kiln's
// kernels). Attention dropout (ops.h) runs on every path of kiln's own (the tensor-core tiles, the
// general fused kernels and the materialised path draw its Philox masks), but cuDNN cannot draw
// them, so a call with dropout takes the path kiln's kernels would take without cuDNN: the tiles
// where they apply, else the general kernels or, past their grid, the materialised path.
bool cudnn_takes(const cuda::CudnnAttention* cudnn, const Masking& masking, const AttentionDropout& dropout) {
  return cudnn != nullptr && masking.key_mask == nullptr && !dropout.active();
}

DropoutMask mask_of(const AttentionDropout& dropout) {
  return dropout.active() ? dropout_mask(dropout.probability, dropout.seed, dropout.stream) : DropoutMask{};
}

cuda::CudnnAttentionShape cudnn_shape(const checks::AttentionShape& shape, DType dtype, bool causal) {
  return {shape.B, shape.T, shape.NH, shape.HS, dtype == DType::BF16, causal};
}
}  // namespace

// The flash-attention contract (ops.h). bf16/fp16 heads up to 256: fused kernels, on tensor cores
// (flash_forward.cu, flash_backward.cu) or CUDA cores (general_attention.cu); see attention_path().
// Otherwise cuBLASLt products: the T x T scores and probabilities live only in the shared workspace
// during the call (in the compute dtype, products accumulated in fp32, softmax in fp32), and
// backward recomputes them from q, k and lse. Consecutive heads are HS apart in qkv, so each batch
// entry's heads are one strided-batched GEMM.
namespace {
// out and lse on the materialised path (above), its scores in `probs` (attention_workspace.h).
void materialized_attention_forward(cuda::LtMatmul& lt, bool tf32, const AttentionForward& a,
                                    const checks::AttentionShape& shape, void* probs) {
  const auto [B, T, C, NH, HS] = shape;
  const auto [scale, causal, key_mask] = masking_of(a, HS);
  const DType dtype = a.qkv.dtype;
  const GemmTypes types{dtype, dtype, tf32};
  for (int64_t b = 0; b < B; ++b) {
    const void* q = at(a.qkv.data, b * T * 3 * C, dtype);
    gemm(lt, types, false, true, T, T, HS, scale, q, 3 * C, at(q, C, dtype), 3 * C, 0.0f,
         at(probs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
  }
  check_cuda(cuda::attention_softmax_forward(probs, a.lse.as<float>(), element_kind(dtype), key_mask, B, NH, T, causal,
                                             mask_of(a.dropout)),
             "attention_forward");
  for (int64_t b = 0; b < B; ++b) {
    const void* v = at(a.qkv.data, b * T * 3 * C + 2 * C, dtype);
    gemm(lt, types, false, false, T, HS, T, 1.0f, at(probs, b * NH * T * T, dtype), T, v, 3 * C, 0.0f,
         at(a.out.data, b * T * C, dtype), C, NH, T * T, HS, HS);
  }
}

}  // namespace

// With fp8 (ops.h) the tiled kernels cast the output as they write it; on the other paths the cast
// kernel casts it after.
void CudaBackend::attention_forward(const AttentionForward& a) {
  const checks::AttentionShape shape = checks::attention_forward(a, kCuda);
  const auto [B, T, C, NH, HS] = shape;
  const DType dtype = a.qkv.dtype;
  const auto [scale, causal, key_mask] = masking_of(a, HS);
  const AttentionPath path =
      attention_path(handles_->fused_attention,
                     cudnn_takes(handles_->cudnn_attention.get(), {scale, causal, key_mask}, a.dropout),
                     handles_->compute_major, dtype, B, NH, HS,
                     {a.qkv.data, a.out.data, a.out_fp8.data, a.out_fp8_t.data});
  ++handles_->attention_forward_calls[static_cast<size_t>(path)];
  switch (path) {
    case AttentionPath::Cudnn: {
      cuda::CudnnAttention& cudnn = *handles_->cudnn_attention;
      const cuda::CudnnAttentionShape on = cudnn_shape(shape, dtype, causal);
      cudnn.forward(on, a.out.data, a.lse.as<float>(), a.qkv.data, scale, workspace(cudnn.forward_workspace_bytes(on)));
      break;
    }
    case AttentionPath::Tiled: {
      handles_->warpgroup_forward_calls += handles_->warpgroup_attention;
      const cuda::AttentionCodes codes{a.fp8 ? a.fp8->scale.as<float>() : nullptr,
                                       a.fp8 ? a.fp8->amax.as<float>() : nullptr, true, a.out_fp8.as<uint8_t>(),
                                       a.out_fp8_t.as<uint8_t>(), nullptr};
      check_cuda(cuda::flash_attention_forward(a.out.data, a.lse.as<float>(), a.qkv.data, key_mask,
                                               element_kind(dtype), B, T, NH, HS, causal, scale,
                                               handles_->warpgroup_attention, a.fp8 ? &codes : nullptr,
                                               mask_of(a.dropout)),
                 handles_->warpgroup_attention ? "attention_forward (fused, tensor cores, wgmma)"
                                               : "attention_forward (fused, tensor cores)");
      return;
    }
    case AttentionPath::General:
      check_cuda(cuda::general_attention_forward(a.out.data, a.lse.as<float>(), a.qkv.data, key_mask,
                                                 element_kind(dtype), B, T, NH, HS, causal, scale, mask_of(a.dropout)),
                 "attention_forward (fused, general)");
      break;
    case AttentionPath::Materialized:
      materialized_attention_forward(*handles_->matmul, handles_->tf32, a, shape,
                                     workspace(attention_workspace_bytes(B, NH, T, dtype, false)));
      break;
  }
  if (a.fp8)
    check_cuda(cuda::cast_fp8(a.out.data, element_kind(dtype), B * T, C, a.fp8->scale.as<float>(),
                              a.fp8->amax.as<float>(), /*e4m3=*/true, a.out_fp8.as<uint8_t>(),
                              a.out_fp8_t.as<uint8_t>()),
               "attention_forward (fp8 output cast)");
}

namespace {
// How the tensor-core kernels run (flash_attention.h): on wgmma; deterministic (else adding dQ
// atomically).
struct TiledKernels {
  bool warpgroup, deterministic;
};

// How the kernels of a path run: `lt` and `tf32` for the materialised path's products, `tiled` for the
// tiled one's, `cudnn` and its engine's workspace for cuDNN's.
struct GradientKernels {
  cuda::LtMatmul& lt;
  bool tf32;
  TiledKernels tiled;
  cuda::CudnnAttention* cudnn;
  void* cudnn_workspace;
};

// dqkv in the compute dtype, on `path`, with the path's scratch (attention_workspace.h) at `scratch`.
void attention_gradient(const GradientKernels& kernels, const AttentionBackward& a, const checks::AttentionShape& shape,
                        AttentionPath path, void* scratch) {
  const auto [B, T, C, NH, HS] = shape;
  const DType dtype = a.qkv.dtype;
  const auto [scale, causal, key_mask] = masking_of(a, HS);
  const TiledKernels tiled = kernels.tiled;
  switch (path) {
    case AttentionPath::Cudnn:
      kernels.cudnn->backward(cudnn_shape(shape, dtype, causal), a.dqkv.data, a.dout.data, a.qkv.data, a.out.data,
                              a.lse.as<float>(), scale, scratch, kernels.cudnn_workspace);
      return;
    case AttentionPath::Tiled:
      check_cuda(cuda::flash_attention_backward(a.dqkv.data, a.dout.data, a.qkv.data, a.out.data, a.lse.as<float>(),
                                                key_mask, element_kind(dtype), B, T, NH, HS, causal, scale, scratch,
                                                tiled.warpgroup, tiled.deterministic, nullptr, mask_of(a.dropout)),
                 tiled.warpgroup ? "attention_backward (fused, tensor cores, wgmma)"
                                 : "attention_backward (fused, tensor cores)");
      return;
    case AttentionPath::General:
      check_cuda(cuda::general_attention_backward(a.dqkv.data, a.dout.data, a.qkv.data, a.out.data, a.lse.as<float>(),
                                                  key_mask, element_kind(dtype), B, T, NH, HS, causal, scale, scratch,
                                                  mask_of(a.dropout)),
                 "attention_backward (fused, general)");
      return;
    case AttentionPath::Materialized: break;
  }
  cuda::LtMatmul& lt = kernels.lt;
  const GemmTypes types{dtype, dtype, kernels.tf32};
  void* probs = scratch;
  void* dprobs = at(probs, static_cast<int64_t>(attention_matrix_bytes(B, NH, T, dtype) / dtype_size(dtype)), dtype);
  for (int64_t b = 0; b < B; ++b) {  // S again, and dP = dO v^T
    const void* q = at(a.qkv.data, b * T * 3 * C, dtype);
    gemm(lt, types, false, true, T, T, HS, scale, q, 3 * C, at(q, C, dtype), 3 * C, 0.0f,
         at(probs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
    gemm(lt, types, false, true, T, T, HS, 1.0f, at(a.dout.data, b * T * C, dtype), C, at(q, 2 * C, dtype), 3 * C,
         0.0f, at(dprobs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
  }
  check_cuda(cuda::attention_softmax_backward(probs, dprobs, a.lse.as<float>(), a.dout.data, a.out.data,
                                              element_kind(dtype), key_mask, B, NH, T, HS, causal, scale,
                                              mask_of(a.dropout)),
             "attention_backward");
  for (int64_t b = 0; b < B; ++b) {
    const void* q = at(a.qkv.data, b * T * 3 * C, dtype);
    void* dq = at(a.dqkv.data, b * T * 3 * C, dtype);
    const void* ds = at(dprobs, b * NH * T * T, dtype);
    const void* p = at(probs, b * NH * T * T, dtype);
    const void* d_o = at(a.dout.data, b * T * C, dtype);
    gemm(lt, types, false, false, T, HS, T, 1.0f, ds, T, at(q, C, dtype), 3 * C, 0.0f, dq, 3 * C, NH, T * T, HS, HS);
    gemm(lt, types, true, false, T, HS, T, 1.0f, ds, T, q, 3 * C, 0.0f, at(dq, C, dtype), 3 * C, NH, T * T, HS, HS);
    gemm(lt, types, true, false, T, HS, T, 1.0f, p, T, d_o, C, 0.0f, at(dq, 2 * C, dtype), 3 * C, NH, T * T, HS,
         HS);
  }
}

}  // namespace

// With fp8 (ops.h): on the tiled path the kernels write dqkv's codes and column sums themselves;
// on the others dqkv is written in the compute dtype into the workspace and cast after, with the
// column sums taken by the cast (fp8.cu). Either way the partial sums follow in the workspace
// (attention_workspace.h) and are added into the bias gradient in a fixed order.
void CudaBackend::attention_backward(const AttentionBackward& a) {
  const checks::AttentionShape shape = checks::attention_backward(a, kCuda);
  const auto [B, T, C, NH, HS] = shape;
  const DType dtype = a.qkv.dtype;
  const auto [scale, causal, key_mask] = masking_of(a, HS);
  cuda::CudnnAttention* cudnn = handles_->cudnn_attention.get();
  const AttentionPath path =
      attention_path(handles_->fused_attention, cudnn_takes(cudnn, {scale, causal, key_mask}, a.dropout),
                     handles_->compute_major, dtype, B, NH, HS,
                     {a.qkv.data, a.dqkv.data, a.dout.data, a.out.data, a.dqkv_fp8.data, a.dqkv_fp8_t.data});
  const bool fused = path != AttentionPath::Materialized;
  const AttentionFp8Gradient fp8{a.fp8 ? 3 * C : 0, a.fp8 && path != AttentionPath::Tiled};
  const TiledKernels tiled{handles_->warpgroup_attention, handles_->deterministic_attention};
  if (path == AttentionPath::Tiled) {
    ++handles_->tiled_backward_calls;
    handles_->atomic_backward_calls += !tiled.deterministic;
  }
  // cuDNN keeps dQ's fp32 sums where the atomic tiled kernels do, and its engine's workspace after all.
  const int64_t query_sum_columns = path == AttentionPath::Cudnn
                                        ? C
                                        : attention_query_sum_columns(path == AttentionPath::Tiled, tiled.deterministic, C);
  const size_t kiln_bytes = (attention_workspace_bytes(B, NH, T, dtype, fused, fp8, query_sum_columns) + 255) / 256 * 256;
  const size_t cudnn_bytes =
      path == AttentionPath::Cudnn ? cudnn->backward_workspace_bytes(cudnn_shape(shape, dtype, causal)) : 0;
  auto* scratch = static_cast<uint8_t*>(workspace(kiln_bytes + cudnn_bytes));
  const size_t own_bytes = (attention_scratch_bytes(B, NH, T, dtype, fused, query_sum_columns) + 255) / 256 * 256;
  void* staged = scratch + own_bytes;  // dqkv, cast after (attention_workspace.h)
  auto* partials = reinterpret_cast<float*>(scratch + own_bytes + attention_staged_gradient_bytes(B, T, dtype, fp8));
  const bool write = a.param_store == GradStore::Write;
  if (a.fp8 && path == AttentionPath::Tiled) {
    const cuda::AttentionCodes codes{a.fp8->dout.scale.as<float>(), a.fp8->dout.amax.as<float>(),
                                             a.fp8->grad_dtype == DType::F8E4M3, a.dqkv_fp8.as<uint8_t>(),
                                             a.dqkv_fp8_t.as<uint8_t>(), a.dbias.empty() ? nullptr : partials};
    check_cuda(cuda::flash_attention_backward(nullptr, a.dout.data, a.qkv.data, a.out.data, a.lse.as<float>(),
                                              key_mask, element_kind(dtype), B, T, NH, HS, causal, scale, scratch,
                                              tiled.warpgroup, tiled.deterministic, &codes, mask_of(a.dropout)),
               "attention_backward (fused, tensor cores, fp8 gradient)");
    if (!a.dbias.empty())
      check_cuda(cuda::sum_column_partials(a.dbias.as<float>(), partials, attention_gradient_partial_rows(B, T), 3 * C,
                                           write),
                 "attention_backward (bias gradient)");
    return;
  }
  AttentionBackward into = a;
  if (a.fp8) into.dqkv = Tensor{staged, Shape{B, T, 3 * C}, dtype, kCuda};
  attention_gradient({*handles_->matmul, handles_->tf32, tiled, cudnn, scratch + kiln_bytes}, into, shape, path,
                     scratch);
  if (!a.fp8) return;
  const int64_t M = B * T, N = 3 * C;
  check_cuda(cuda::cast_fp8(staged, element_kind(dtype), M, N, a.fp8->dout.scale.as<float>(),
                            a.fp8->dout.amax.as<float>(), a.fp8->grad_dtype == DType::F8E4M3,
                            a.dqkv_fp8.as<uint8_t>(), a.dqkv_fp8_t.as<uint8_t>(), a.dbias.empty() ? nullptr : partials),
             "attention_backward (fp8 gradient cast)");
  if (!a.dbias.empty())
    check_cuda(cuda::sum_column_partials(a.dbias.as<float>(), partials, fp8_cast_tile_rows(M), N, write),
               "attention_backward (bias gradient)");
}


}  // namespace kiln
