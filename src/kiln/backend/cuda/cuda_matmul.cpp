// The CUDA back-end's matrix products (ops.h, MatmulForward and MatmulBackward), all through
// cuBLASLt (lt_matmul.h). Bias, GELU and their gradients go into cuBLASLt's epilogues where it has
// an algorithm for them; otherwise the bias is broadcast into the output before an accumulating
// product, the bias gradient is a column-sum kernel, and GELU runs as its own kernel. fp8 products
// cast their operands first (fp8.cu).
#include "kiln/backend/fp8_workspace.h"
#include "kiln/backend/cuda/cuda_backend_shared.h"
#include "kiln/backend/op_checks.h"

namespace kiln {

using cuda::check_cuda;
using cuda::Gemm;
using cuda::GemmEpilogue;
using cuda::GemmTypes;
using cuda_backend::element_kind;
using cuda_backend::kCuda;

namespace {

// GELU inside the products (cuBLASLt's GELU epilogues) except in strict fp32: that mode is the
// reference the op table holds to fp32 rounding, and cuBLASLt does not document its GELU to that
// precision. The auxiliary matrix (the pre-activation) needs a leading dimension divisible by 8.
bool gelu_epilogue_applies(const GemmTypes& types, int64_t aux_columns) {
  return (types.inputs != DType::F32 || types.tf32) && aux_columns % 8 == 0;
}

// GELU's derivative in cuBLASLt's DGELU epilogue, except after an fp8 product. A block's MLP casts
// that input gradient for the next product (ops.h, din_reader), and the cast applies the
// derivative for the same bytes (it reads the pre-activation the epilogue would have); without
// din_reader (the encoder's last block below intermediate layers, block.h) a GELU backward kernel
// follows the product. Measured on an H100 (cuBLAS 13.0, 2026-11-26,
// bench/NOTES.md): with the epilogue, c_proj's fp8 backward at GPT-2 124M/64 took 2.23 ms, against
// 0.49 ms for c_fc's fp8 backward (the same FLOPs, no epilogue) and 0.70 ms for c_fc's fp8 forward
// (the same product shape, with its GELU epilogue and the same cast kernel).
bool dgelu_epilogue_applies(const GemmTypes& types, int64_t aux_columns) {
  return !checks::is_fp8(types.inputs) && gelu_epilogue_applies(types, aux_columns);
}

// Where an fp8 product's operands are cast to (fp8_workspace.h): consecutive 256-byte-aligned
// regions of the workspace.
class Fp8Regions {
 public:
  explicit Fp8Regions(void* workspace) : next_(static_cast<uint8_t*>(workspace)) {}
  uint8_t* take(int64_t elements) {
    uint8_t* region = next_;
    next_ += fp8_region_bytes(elements);
    return region;
  }

 private:
  uint8_t* next_;
};

// Casts `operand` ([rows, cols] of kind) to E4M3 or E5M2 into `out` (same layout) and/or `out_t`
// (transposed), with its Fp8Operand's scale and amax; with column_partials, also its column sums
// before the cast (kernels.h).
void cast(const Tensor& operand, int64_t rows, int64_t cols, const Fp8Operand& fp8, DType format, uint8_t* out,
          uint8_t* out_t, float* column_partials = nullptr) {
  check_cuda(cuda::cast_fp8(operand.data, element_kind(operand.dtype), rows, cols, fp8.scale.as<float>(),
                            fp8.amax.as<float>(), format == DType::F8E4M3, out, out_t, column_partials),
             "cast_fp8");
}

}  // namespace

void CudaBackend::matmul_forward(const MatmulForward& a) {
  const auto [M, K, N] = checks::matmul_forward(a, kCuda);
  const DType dtype = a.out.dtype;
  const bool in_codes = a.in.dtype == DType::F8E4M3;  // cast already (ops.h)
  const bool out_in = a.layout == WeightLayout::OutIn;
  cuda::LtMatmul& lt = *handles_->matmul;
  Gemm product{{dtype, dtype, handles_->tf32}, false, out_in, M, N, K, 1.0f, a.in.data, K, a.weight.data,
               out_in ? K : N, 0.0f, a.out.data, N};
  if (a.fp8) {  // in [M,K] and the weight as [N,K], both E4M3 (ops.h), each unless given as codes
    const bool weight_codes = !a.weight_fp8.empty();
    Fp8Regions regions(workspace(fp8_forward_cast_bytes(M, K, N, weight_codes)));
    uint8_t* in8 = in_codes ? a.in.as<uint8_t>() : regions.take(M * K);
    uint8_t* weight8 = weight_codes ? a.weight_fp8.as<uint8_t>() : regions.take(N * K);
    if (!in_codes)  // with the kept codes too, if asked
      cast(a.in, M, K, a.fp8->in, DType::F8E4M3, in8, a.in_fp8_t.as<uint8_t>());
    if (!weight_codes)  // [N,K]: the weight as stored with OutIn, transposed with InOut
      cast(a.weight, out_in ? N : K, out_in ? K : N, a.fp8->weight, DType::F8E4M3, out_in ? weight8 : nullptr,
           out_in ? nullptr : weight8);
    product = {{DType::F8E4M3, dtype}, false, true, M, N, K, 1.0f, in8, K, weight8, K, 0.0f, a.out.data, N};
    product.a_scale = a.fp8->in.scale_inv.as<float>();
    product.b_scale = a.fp8->weight.scale_inv.as<float>();
    product.fast_accumulation = handles_->fp8_fast_accumulation;
  }
  if (!a.residual.empty()) {  // out = product + residual (+ bias), one rounding: C read apart from D
    product.beta = 1.0f;
    product.addend = a.residual.data;
  }
  // GELU in the compute dtype; with gelu_fp8 the cast below applies it instead (ops.h).
  const bool gelu = !a.gelu_out.empty() && !a.gelu_fp8;
  const bool epilogues = handles_->matmul_epilogues;
  if (epilogues && gelu && !a.bias.empty() && gelu_epilogue_applies(product.types, N)) {
    Gemm fused = product;  // gelu_out = gelu(in W + b), the pre-activation into out
    fused.C = a.gelu_out.data;
    fused.epilogue = GemmEpilogue::GeluAuxBias;
    fused.bias = a.bias.data;
    fused.aux = a.out.data;
    fused.aux_ld = N;
    if (lt.run(fused)) return;
  }
  if (!a.bias.empty()) {
    Gemm biased = product;
    biased.epilogue = GemmEpilogue::Bias;
    biased.bias = a.bias.data;
    if (!epilogues || !lt.run(biased)) {  // out = bias (+ residual, rounded: a second rounding), then += the product
      check_cuda(cuda::broadcast_rows(a.out.data, a.bias.data, a.residual.data, element_kind(dtype), M, N),
                 "matmul_forward");
      product.beta = 1.0f;
      product.addend = nullptr;
      lt.run(product);
    }
  } else {
    lt.run(product);
  }
  if (gelu)
    check_cuda(cuda::gelu_forward(a.gelu_out.data, a.out.data, element_kind(dtype), M * N), "matmul_forward (gelu)");
  if (a.gelu_fp8) gelu_forward({a.gelu_out, a.out, a.gelu_fp8, a.gelu_out_t});
}

// `product` writes din [M,K]; with gelu_in, din is then multiplied by gelu'(gelu_in): in cuBLASLt's
// DGELU epilogue where that applies (dgelu_epilogue_applies) and it has an algorithm for it, else
// in a kernel after the product.
void CudaBackend::input_gradient(const Gemm& product, const Tensor& gelu_in) {
  cuda::LtMatmul& lt = *handles_->matmul;
  if (handles_->matmul_epilogues && !gelu_in.empty() && dgelu_epilogue_applies(product.types, product.N)) {
    Gemm fused = product;
    fused.epilogue = GemmEpilogue::Dgelu;
    fused.aux = gelu_in.data;
    fused.aux_ld = product.N;
    if (lt.run(fused)) return;
  }
  lt.run(product);
  if (!gelu_in.empty())
    check_cuda(cuda::gelu_backward(product.C, gelu_in.data, product.C, element_kind(gelu_in.dtype),
                                   product.M * product.N),
               "matmul_backward (gelu)");
}

// din cast for its reader (ops.h, din_reader): the fp8 `product` writes 16-bit din into its region,
// and the cast writes din's codes in both layouts with the reader's scale and amax, GELU's
// derivative applied on the way where gelu_in is given (not in the product: dgelu_epilogue_applies),
// and, with `partials`, the reader's bias gradient's column sums.
void CudaBackend::cast_din(const Gemm& product, const MatmulBackward& a, float* partials) {
  const int64_t M = product.M, K = product.N;
  const Fp8Operand& reader = a.din_reader->dout;
  const bool e4m3 = a.din_reader->grad_dtype == DType::F8E4M3;
  handles_->matmul->run(product);
  if (a.gelu_in.empty())
    check_cuda(cuda::cast_fp8(product.C, element_kind(a.weight.dtype), M, K, reader.scale.as<float>(),
                              reader.amax.as<float>(), e4m3, a.din_fp8.as<uint8_t>(), a.din_fp8_t.as<uint8_t>(),
                              partials),
               "matmul_backward (din cast)");
  else
    check_cuda(cuda::cast_gelu_gradient_fp8(product.C, a.gelu_in.data, element_kind(a.weight.dtype), M, K,
                                            reader.scale.as<float>(), reader.amax.as<float>(), e4m3,
                                            a.din_fp8.as<uint8_t>(), a.din_fp8_t.as<uint8_t>(), partials),
               "matmul_backward (din cast through GELU)");
  if (partials)
    check_cuda(cuda::sum_column_partials(a.reader_dbias.as<float>(), partials, fp8_cast_tile_rows(M), K,
                                         a.param_store == GradStore::Write),
               "matmul_backward (din cast)");
}

void CudaBackend::matmul_backward(const MatmulBackward& a) {
  const auto [M, K, N] = checks::matmul_backward(a, kCuda);
  if (a.fp8) return matmul_backward_fp8(a, M, K, N);
  const DType dtype = a.in.dtype;
  const int kind = element_kind(dtype);
  const bool in_out = a.layout == WeightLayout::InOut;
  cuda::LtMatmul& lt = *handles_->matmul;
  if (!a.din.empty()) {  // din = dout W^T (InOut) or dout W (OutIn), times gelu'(gelu_in) when given
    input_gradient({{dtype, dtype, handles_->tf32}, false, in_out, M, K, N, 1.0f, a.dout.data, N, a.weight.data,
                    in_out ? N : K, 0.0f, a.din.data, K},
                   a.gelu_in);
  }
  // dweight += (or, with Write, =: beta 0, the old values unread) in^T dout (InOut, [K,N]) or
  // dout^T in (OutIn, [N,K]), accumulated in fp32; the bias gradient is the column sums of dout,
  // which is op(B) of the first and op(A) of the second.
  const bool write = a.param_store == GradStore::Write;
  const float beta = write ? 0.0f : 1.0f;
  Gemm weight_grad = in_out ? Gemm{{dtype, DType::F32, handles_->tf32}, true, false, K, N, M, 1.0f, a.in.data, K,
                                   a.dout.data, N, beta, a.dweight.data, N}
                            : Gemm{{dtype, DType::F32, handles_->tf32}, true, false, N, K, M, 1.0f, a.dout.data, N,
                                   a.in.data, K, beta, a.dweight.data, K};
  if (!a.dbias.empty()) {
    // The epilogue writes the bias gradient: straight into dbias with Write, else into the shared
    // workspace, to be added to dbias. cuBLASLt states no alignment for the bias-gradient pointer;
    // the workspace is 256-byte aligned, and dbias is used in its place only when 16-byte aligned
    // (every GPT-2 size's biases are).
    const bool in_place = write && reinterpret_cast<uintptr_t>(a.dbias.data) % 16 == 0;
    auto* bias_grad =
        in_place ? a.dbias.as<float>() : static_cast<float*>(workspace(static_cast<size_t>(N) * sizeof(float)));
    Gemm fused = weight_grad;
    fused.epilogue = in_out ? GemmEpilogue::BiasGradFromB : GemmEpilogue::BiasGradFromA;
    fused.bias_grad = bias_grad;
    if (handles_->matmul_epilogues && lt.run(fused)) {
      if (in_place) return;
      check_cuda(write ? cuda::convert(a.dbias.data, cuda::kFp32, bias_grad, cuda::kFp32, N)  // a copy
                       : cuda::add_floats(a.dbias.as<float>(), bias_grad, N),
                 "matmul_backward");
      return;
    }
    check_cuda(cuda::sum_columns(a.dbias.as<float>(), a.dout.data, kind, M, N,
                                 workspace(cuda::column_sums_workspace_bytes(M, N)), write),
               "matmul_backward");
  }
  lt.run(weight_grad);
}

// fp8 backward (ops.h): dout cast to its gradient format [M,N] and transposed (or its codes as
// its writer cast them), the weight as [K,N] (or its codes as a Convert cast them) and `in`
// transposed [K,M] (or its codes as the forward kept them), all K-contiguous for cuBLASLt; the
// bias gradient from dout before its cast, summed by that cast; GELU's derivative as in full
// precision (input_gradient), or with din cast for its reader, as cast_din says.
void CudaBackend::matmul_backward_fp8(const MatmulBackward& a, int64_t M, int64_t K, int64_t N) {
  const DType dtype = a.weight.dtype, grad = a.fp8->grad_dtype;
  const bool in_out = a.layout == WeightLayout::InOut;
  const bool codes_kept = !a.in_fp8_t.empty(), dout_codes = !a.dout_fp8_t.empty(),
             weight_codes = !a.weight_fp8.empty(), din_cast = a.din_reader != nullptr;
  cuda::LtMatmul& lt = *handles_->matmul;
  const size_t cast_bytes = fp8_backward_cast_bytes(M, K, N, codes_kept, dout_codes, weight_codes, din_cast);
  // One set of column partials: dout's for this product's bias gradient, or din's for its reader's
  // (checks: not both).
  const int64_t partial_columns = !a.dbias.empty() ? N : !a.reader_dbias.empty() ? K : 0;
  auto* base = static_cast<uint8_t*>(
      workspace(cast_bytes + (partial_columns ? fp8_bias_partials_bytes(M, partial_columns) : 0)));
  // The bias gradient: dout's column sums, taken by its cast on the way (before the cast, ops.h).
  float* partials = partial_columns ? reinterpret_cast<float*>(base + cast_bytes) : nullptr;
  float* bias_partials = a.dbias.empty() ? nullptr : partials;
  Fp8Regions regions(base);
  void* din = din_cast ? regions.take(2 * M * K) : a.din.data;  // din_cast: 16-bit din, cast below
  uint8_t* dout8 = dout_codes ? a.dout.as<uint8_t>() : regions.take(M * N);
  uint8_t* dout8_t = dout_codes ? a.dout_fp8_t.as<uint8_t>() : regions.take(M * N);
  uint8_t* weight8 = weight_codes ? a.weight_fp8.as<uint8_t>() : regions.take(K * N);
  uint8_t* in8_t = codes_kept ? a.in_fp8_t.as<uint8_t>() : regions.take(K * M);
  if (!dout_codes) cast(a.dout, M, N, a.fp8->dout, grad, din ? dout8 : nullptr, dout8_t, bias_partials);
  if (din) {  // din [M,K] = dout [M,N] x (weight as [K,N])^T, then gelu'(gelu_in)
    if (!weight_codes)  // [K,N]: the weight as stored with InOut, transposed with OutIn
      cast(a.weight, in_out ? K : N, in_out ? N : K, a.fp8->weight, DType::F8E4M3, in_out ? weight8 : nullptr,
           in_out ? nullptr : weight8);
    Gemm product{{grad, dtype, false, DType::F8E4M3}, false, true, M, K, N, 1.0f, dout8, N, weight8, N, 0.0f,
                 din, K};
    product.a_scale = a.fp8->dout.scale_inv.as<float>();
    product.b_scale = a.fp8->weight.scale_inv.as<float>();
    if (din_cast) cast_din(product, a, a.reader_dbias.empty() ? nullptr : partials);
    else input_gradient(product, a.gelu_in);
  }
  // dweight += (Write: =) in^T dout ([K,N]: A = in^T [K,M], B = dout^T [N,M]) or dout^T in ([N,K]).
  if (!codes_kept) cast(a.in, M, K, a.fp8->in, DType::F8E4M3, nullptr, in8_t);
  const bool write = a.param_store == GradStore::Write;
  const float beta = write ? 0.0f : 1.0f;
  Gemm weight_grad = in_out ? Gemm{{DType::F8E4M3, DType::F32, false, grad}, false, true, K, N, M, 1.0f, in8_t, M,
                                   dout8_t, M, beta, a.dweight.data, N}
                            : Gemm{{grad, DType::F32, false, DType::F8E4M3}, false, true, N, K, M, 1.0f, dout8_t, M,
                                   in8_t, M, beta, a.dweight.data, K};
  weight_grad.a_scale = (in_out ? a.fp8->in : a.fp8->dout).scale_inv.as<float>();
  weight_grad.b_scale = (in_out ? a.fp8->dout : a.fp8->in).scale_inv.as<float>();
  lt.run(weight_grad);
  if (bias_partials)
    check_cuda(cuda::sum_column_partials(a.dbias.as<float>(), bias_partials, fp8_cast_tile_rows(M), N, write),
               "matmul_backward");
}

}  // namespace kiln
