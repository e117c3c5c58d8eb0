#include "kiln/backend/op_checks.h"

#include <cstdint>

namespace kiln::checks {

namespace {
// `names`: the argument names of the operand's scale, scale_inv and amax, for the errors.
void require_fp8_operand(const Fp8Operand& operand, Device device, const char* op, const char* const (&names)[3]) {
  const Tensor* parts[3] = {&operand.scale, &operand.scale_inv, &operand.amax};
  for (int i = 0; i < 3; ++i) {
    require(*parts[i], DType::F32, device, op, names[i]);
    require_numel(*parts[i], 1, op, names[i]);
  }
  KILN_CHECK(reinterpret_cast<uintptr_t>(operand.scale_inv.data) % 16 == 0, "{}: argument '{}' must be 16-byte aligned",
             op, names[1]);
}

// An op that casts what it computes (`what`, [M, N]) for an fp8 product (ops.h): the compute dtype
// 16-bit and both sides (named `dims`) multiples of 16.
void require_castable(DType dtype, int64_t M, int64_t N, const char* op, const char* what, const char* dims) {
  KILN_CHECK(dtype == DType::BF16 || dtype == DType::F16, "{}: {} cast to fp8 needs bf16 or fp16, not {}", op, what,
             dtype_name(dtype));
  KILN_CHECK(M % 16 == 0 && N % 16 == 0, "{}: {} cast to fp8 needs {} multiples of 16, got {} x {}", op, what, dims, M,
             N);
}

// Codes of `format` in a [rows, cols] matrix, the layout named `layout` in the error.
void require_codes_matrix(const Tensor& codes, DType format, int64_t rows, int64_t cols, Device device, const char* op,
                          const char* name, const char* layout) {
  require(codes, format, device, op, name);
  KILN_CHECK(codes.shape.rank == 2 && codes.shape[0] == rows && codes.shape[1] == cols,
             "{}: argument '{}' must be {} = [{}, {}], got {}", op, name, layout, rows, cols, codes.shape.to_string());
}

// A LayerNorm that casts its output for an fp8 product (ops.h): codes in place of the output.
void layernorm_fp8_output(const LayerNormForward& a, DType dtype, int64_t M, int64_t C, Device device) {
  constexpr const char* op = "layernorm_forward";
  require_castable(dtype, M, C, op, "an output", "rows and columns");
  KILN_CHECK(a.out.empty(), "{}: argument 'out' is given with 'fp8' (the output is only cast)", op);
  require_fp8_operand(*a.fp8, device, op, {"fp8 scale", "fp8 scale_inv", "fp8 amax"});
  require_codes_matrix(a.out_fp8, DType::F8E4M3, M, C, device, op, "out_fp8", "[M, C]");
  if (a.out_fp8_t.empty()) return;  // no backward reads them (ops.h)
  require_codes_matrix(a.out_fp8_t, DType::F8E4M3, C, M, device, op, "out_fp8_t", "[C, M]");
}

// The names an op gives the gradient it casts and its codes, for the errors.
struct GradientCodesNames {
  const char* what;  // the gradient, "a gradient"
  const char* dims;  // its sides, "B*T and 3C"
  const char* codes;
  const char* codes_layout;
  const char* codes_t;
  const char* codes_t_layout;
  const char* dbias;
};

// A gradient [M, N] an op casts for the fp8 backward of the product reading it next (ops.h,
// AttentionBackward and LayerNormBackward with fp8): codes in that product's gradient format in
// both layouts, and optionally its bias gradient.
void require_gradient_codes(const Fp8Matmul& fp8, DType dtype, int64_t M, int64_t N, const Tensor& codes,
                            const Tensor& codes_t, const Tensor& dbias, Device device, const char* op,
                            const GradientCodesNames& names) {
  require_castable(dtype, M, N, op, names.what, names.dims);
  require_fp8_operand(fp8.dout, device, op, {"fp8 dout scale", "fp8 dout scale_inv", "fp8 dout amax"});
  KILN_CHECK(is_fp8(fp8.grad_dtype), "{}: the gradient's fp8 format must be fp8_e5m2 or fp8_e4m3, not {}", op,
             dtype_name(fp8.grad_dtype));
  require_codes_matrix(codes, fp8.grad_dtype, M, N, device, op, names.codes, names.codes_layout);
  require_codes_matrix(codes_t, fp8.grad_dtype, N, M, device, op, names.codes_t, names.codes_t_layout);
  if (dbias.empty()) return;
  require(dbias, DType::F32, device, op, names.dbias);
  require_numel(dbias, N, op, names.dbias);
}
}  // namespace

EmbeddingDims embedding_forward(const EmbeddingForward& a, Device device) {
  constexpr const char* op = "embedding_forward";
  const DType dtype = compute_dtype(a.out, device, op, "out");
  require(a.tokens, DType::I32, device, op, "tokens");
  require(a.wte, dtype, device, op, "wte");
  require(a.wpe, dtype, device, op, "wpe");
  const EmbeddingDims dims{a.tokens.shape[0], a.tokens.shape[1], a.wte.shape[1]};
  KILN_CHECK(dims.T <= a.wpe.shape[0], "{}: sequence {} exceeds {} positions", op, dims.T, a.wpe.shape[0]);
  require_numel(a.out, dims.B * dims.T * dims.C, op, "out");
  return dims;
}

EmbeddingDims embedding_backward(const EmbeddingBackward& a, Device device) {
  constexpr const char* op = "embedding_backward";
  require(a.dwte, DType::F32, device, op, "dwte");
  require(a.dwpe, DType::F32, device, op, "dwpe");
  compute_dtype(a.dout, device, op, "dout");
  require(a.tokens, DType::I32, device, op, "tokens");
  const EmbeddingDims dims{a.tokens.shape[0], a.tokens.shape[1], a.dwte.shape[1]};
  require_numel(a.dout, dims.B * dims.T * dims.C, op, "dout");
  return dims;
}

RowsDims layernorm_forward(const LayerNormForward& a, Device device) {
  constexpr const char* op = "layernorm_forward";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  for (auto [tensor, name] : {std::pair{&a.weight, "weight"}, {&a.bias, "bias"}})
    require(*tensor, dtype, device, op, name);
  require(a.mean, DType::F32, device, op, "mean");
  require(a.rstd, DType::F32, device, op, "rstd");
  const int64_t C = a.weight.numel(), M = a.in.numel() / C;
  require_numel(a.in, M * C, op, "in");
  require_numel(a.mean, M, op, "mean");
  require_numel(a.rstd, M, op, "rstd");
  require_numel(a.bias, C, op, "bias");
  if (a.fp8) {
    layernorm_fp8_output(a, dtype, M, C, device);
  } else {
    require(a.out, dtype, device, op, "out");
    require_numel(a.out, M * C, op, "out");
    KILN_CHECK(a.out_fp8.empty() && a.out_fp8_t.empty(), "{}: fp8 codes of the output are given without 'fp8'", op);
  }
  return {M, C};
}

RowsDims layernorm_backward(const LayerNormBackward& a, Device device) {
  constexpr const char* op = "layernorm_backward";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  for (auto [tensor, name] : {std::pair{&a.din, "din"}, {&a.dout, "dout"}, {&a.weight, "weight"}})
    require(*tensor, dtype, device, op, name);
  for (auto [tensor, name] : {std::pair{&a.dweight, "dweight"}, {&a.dbias, "dbias"}, {&a.mean, "mean"},
                              {&a.rstd, "rstd"}})
    require(*tensor, DType::F32, device, op, name);
  const int64_t C = a.weight.numel(), M = a.in.numel() / C;
  require_numel(a.din, M * C, op, "din");
  require_numel(a.dout, M * C, op, "dout");
  require_numel(a.mean, M, op, "mean");
  require_numel(a.rstd, M, op, "rstd");
  if (a.fp8)  // din cast for the next product's backward too (ops.h)
    require_gradient_codes(*a.fp8, dtype, M, C, a.din_fp8, a.din_fp8_t, a.product_dbias, device, op,
                           {"an input gradient", "rows and columns", "din_fp8", "[M, C]", "din_fp8_t", "[C, M]",
                            "product_dbias"});
  else
    KILN_CHECK(a.din_fp8.empty() && a.din_fp8_t.empty() && a.product_dbias.empty(),
               "{}: fp8 codes of din or a product's bias gradient are given without 'fp8'", op);
  return {M, C};
}

namespace {
void require_fp8(const Fp8Matmul& fp8, DType compute, const MatmulDims& dims, Device device, const char* op,
                 bool backward) {
  KILN_CHECK(compute == DType::BF16 || compute == DType::F16, "{}: fp8 products take bf16 or fp16 operands, not {}",
             op, dtype_name(compute));
  // cuBLASLt's fp8 kernels read 16-byte-aligned rows of 1-byte elements in every operand layout.
  KILN_CHECK(dims.M % 16 == 0 && dims.K % 16 == 0 && dims.N % 16 == 0,
             "{}: fp8 products need M, K and N multiples of 16, got {} x {} x {}", op, dims.M, dims.K, dims.N);
  require_fp8_operand(fp8.in, device, op, {"fp8 in scale", "fp8 in scale_inv", "fp8 in amax"});
  require_fp8_operand(fp8.weight, device, op, {"fp8 weight scale", "fp8 weight scale_inv", "fp8 weight amax"});
  if (!backward) return;
  require_fp8_operand(fp8.dout, device, op, {"fp8 dout scale", "fp8 dout scale_inv", "fp8 dout amax"});
  KILN_CHECK(is_fp8(fp8.grad_dtype),
             "{}: the output gradient's fp8 format must be fp8_e5m2 or fp8_e4m3, not {}", op,
             dtype_name(fp8.grad_dtype));
}
// `in`'s kept E4M3 codes (ops.h): [K, M], only with an fp8 product.
void require_in_fp8_t(const Tensor& in_fp8_t, bool fp8, const MatmulDims& dims, Device device, const char* op) {
  if (in_fp8_t.empty()) return;
  KILN_CHECK(fp8, "{}: argument 'in_fp8_t' (fp8 codes of the input) is given to a product without fp8", op);
  require_codes_matrix(in_fp8_t, DType::F8E4M3, dims.K, dims.M, device, op, "in_fp8_t", "[K, M]");
}
// The weight's codes cast already (ops.h, weight_fp8): [rows, cols] E4M3, only with an fp8 product.
void require_weight_fp8(const Tensor& weight_fp8, bool fp8, int64_t rows, int64_t cols, Device device, const char* op,
                        const char* layout) {
  if (weight_fp8.empty()) return;
  KILN_CHECK(fp8, "{}: argument 'weight_fp8' (fp8 codes of the weight) is given to a product without fp8", op);
  require_codes_matrix(weight_fp8, DType::F8E4M3, rows, cols, device, op, "weight_fp8", layout);
}
// A GELU output [M, N] cast for the next fp8 product instead of stored (ops.h: MatmulForward's
// gelu_fp8, GeluForward's fp8): codes in place of the output, in either layout or both.
void gelu_codes(const Tensor& codes, const Tensor& codes_t, const Fp8Operand& fp8, DType dtype, int64_t M,
                int64_t N, Device device, const char* op, const char* names[3]) {
  require_castable(dtype, M, N, op, "a GELU output", "M and N");
  require_fp8_operand(fp8, device, op, {"fp8 scale", "fp8 scale_inv", "fp8 amax"});
  KILN_CHECK(!codes.empty() || !codes_t.empty(), "{}: '{}' is given without '{}' or '{}' (the codes go nowhere)", op,
             names[0], names[1], names[2]);
  if (!codes.empty()) {
    require(codes, DType::F8E4M3, device, op, names[1]);
    KILN_CHECK(codes.numel() == M * N && codes.shape[codes.shape.rank - 1] == N,
               "{}: argument '{}' must be [M, N] = [{}, {}] with '{}', got {}", op, names[1], M, N, names[0],
               codes.shape.to_string());
  }
  if (!codes_t.empty()) require_codes_matrix(codes_t, DType::F8E4M3, N, M, device, op, names[2], "[N, M]");
}
// `dout` as the codes its writer cast (ops.h, MatmulBackward): in the product's gradient format,
// with their transpose, and no bias gradient (the writer took it). Shapes are checked by the caller.
void dout_cast_already(const MatmulBackward& a, Device device) {
  constexpr const char* op = "matmul_backward";
  KILN_CHECK(a.fp8, "{}: argument 'dout' is fp8 codes for a product without fp8", op);
  require(a.dout, a.fp8->grad_dtype, device, op, "dout");
  KILN_CHECK(!a.dout_fp8_t.empty(), "{}: argument 'dout' is codes without their transpose 'dout_fp8_t'", op);
  KILN_CHECK(a.dbias.empty(), "{}: argument 'dbias' is given with 'dout' cast already (its writer took the bias "
             "gradient)", op);
}
}  // namespace

MatmulDims matmul_forward(const MatmulForward& a, Device device) {
  constexpr const char* op = "matmul_forward";
  // `in` as codes (ops.h): the compute dtype is out's.
  const bool in_codes = a.in.dtype == DType::F8E4M3 && !a.in.empty();
  const DType dtype = compute_dtype(in_codes ? a.out : a.in, device, op, in_codes ? "out" : "in");
  if (in_codes) {
    KILN_CHECK(a.fp8, "{}: argument 'in' is fp8 codes for a product without fp8", op);
    require(a.in, DType::F8E4M3, device, op, "in");
    KILN_CHECK(a.in_fp8_t.empty(), "{}: argument 'in_fp8_t' is given with 'in' cast already (its writer keeps them)",
               op);
  }
  require(a.out, dtype, device, op, "out");
  require(a.weight, dtype, device, op, "weight");
  const MatmulDims dims = matmul_dims(a.in, a.weight, a.layout, op);
  require_numel(a.out, dims.M * dims.N, op, "out");
  if (!a.bias.empty()) {
    require(a.bias, dtype, device, op, "bias");
    require_numel(a.bias, dims.N, op, "bias");
  }
  if (a.gelu_fp8) {
    const char* names[3] = {"gelu_fp8", "gelu_out", "gelu_out_t"};
    gelu_codes(a.gelu_out, a.gelu_out_t, *a.gelu_fp8, dtype, dims.M, dims.N, device, op, names);
  } else if (!a.gelu_out.empty()) {
    require(a.gelu_out, dtype, device, op, "gelu_out");
    require_numel(a.gelu_out, dims.M * dims.N, op, "gelu_out");
  }
  if (!a.residual.empty()) {
    KILN_CHECK(a.gelu_out.empty() && !a.gelu_fp8, "{}: argument 'residual' is given with GELU (GELU then the add is "
               "no fusion kiln has)", op);
    require(a.residual, dtype, device, op, "residual");
    require_numel(a.residual, dims.M * dims.N, op, "residual");
    KILN_CHECK(a.residual.data != a.out.data, "{}: argument 'residual' is 'out' itself (the sum goes elsewhere)", op);
  }
  if (a.fp8) require_fp8(*a.fp8, dtype, dims, device, op, false);
  require_in_fp8_t(a.in_fp8_t, a.fp8 != nullptr, dims, device, op);
  require_weight_fp8(a.weight_fp8, a.fp8 != nullptr, dims.N, dims.K, device, op, "[N, K]");
  KILN_CHECK(a.gelu_fp8 || a.gelu_out_t.empty(), "{}: argument 'gelu_out_t' is given without 'gelu_fp8'", op);
  return dims;
}

MatmulDims matmul_backward(const MatmulBackward& a, Device device) {
  constexpr const char* op = "matmul_backward";
  // Without `in` (its kept codes stand in for it), the compute dtype is dout's, or with dout cast
  // already the weight's, and M comes from dout.
  const bool in_given = !a.in.empty() || a.in_fp8_t.empty();
  const bool dout_codes = is_fp8(a.dout.dtype) && !a.dout.empty();
  const Tensor& typed = in_given ? a.in : dout_codes ? a.weight : a.dout;
  const DType dtype = compute_dtype(typed, device, op, in_given ? "in" : dout_codes ? "weight" : "dout");
  if (dout_codes) dout_cast_already(a, device);
  else require(a.dout, dtype, device, op, "dout");
  KILN_CHECK(dout_codes || a.dout_fp8_t.empty(), "{}: argument 'dout_fp8_t' is given with 'dout' in the compute "
             "dtype (it comes with dout's codes)", op);
  require(a.weight, dtype, device, op, "weight");
  require(a.dweight, DType::F32, device, op, "dweight");
  const MatmulDims dims = in_given ? matmul_dims(a.in, a.weight, a.layout, op)
                                   : matmul_dims_from_output(a.dout, a.weight, a.layout, op);
  require_numel(a.dout, dims.M * dims.N, op, "dout");
  KILN_CHECK(a.dweight.shape == a.weight.shape, "{}: dweight {} differs from weight {}", op,
             a.dweight.shape.to_string(), a.weight.shape.to_string());
  if (!a.din.empty()) {
    require(a.din, dtype, device, op, "din");
    require_numel(a.din, dims.M * dims.K, op, "din");
  }
  if (!a.dbias.empty()) {
    require(a.dbias, DType::F32, device, op, "dbias");
    require_numel(a.dbias, dims.N, op, "dbias");
  }
  if (!a.gelu_in.empty()) {
    KILN_CHECK(!a.din.empty() || a.din_reader, "{}: argument 'gelu_in' is given without 'din' to receive its gradient",
               op);
    require(a.gelu_in, dtype, device, op, "gelu_in");
    require_numel(a.gelu_in, dims.M * dims.K, op, "gelu_in");
  }
  if (a.fp8) require_fp8(*a.fp8, dtype, dims, device, op, true);
  require_in_fp8_t(a.in_fp8_t, a.fp8 != nullptr, dims, device, op);
  require_weight_fp8(a.weight_fp8, a.fp8 != nullptr, dims.K, dims.N, device, op, "[K, N]");
  KILN_CHECK(a.weight_fp8.empty() || !a.din.empty(),
             "{}: argument 'weight_fp8' is given without 'din' (only the input gradient reads the weight)", op);
  if (dout_codes)
    require_codes_matrix(a.dout_fp8_t, a.fp8->grad_dtype, dims.N, dims.M, device, op, "dout_fp8_t", "[N, M]");
  if (a.din_reader) {  // din cast for the next product's backward (ops.h)
    KILN_CHECK(a.fp8, "{}: argument 'din_reader' is given without 'fp8' (only an fp8 product casts its din)", op);
    KILN_CHECK(a.din.empty(), "{}: argument 'din' is given with 'din_reader' (din is only cast)", op);
    KILN_CHECK(a.dbias.empty(), "{}: argument 'dbias' is given with 'din_reader' (dout's codes carry the bias "
               "gradient of the op that cast them)", op);
    require_gradient_codes(*a.din_reader, dtype, dims.M, dims.K, a.din_fp8, a.din_fp8_t, a.reader_dbias, device, op,
                           {"an input gradient", "M and K", "din_fp8", "[M, K]", "din_fp8_t", "[K, M]",
                            "reader_dbias"});
  } else {
    KILN_CHECK(a.din_fp8.empty() && a.din_fp8_t.empty() && a.reader_dbias.empty(),
               "{}: fp8 codes of din or a reader's bias gradient are given without 'din_reader'", op);
  }
  return dims;
}

int64_t gelu_forward(const GeluForward& a, Device device) {
  constexpr const char* op = "gelu_forward";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  if (a.fp8) {
    const int64_t N = a.in.shape.rank ? a.in.shape[a.in.shape.rank - 1] : 0, M = N ? a.in.numel() / N : 0;
    const char* names[3] = {"fp8", "out", "out_fp8_t"};
    gelu_codes(a.out, a.out_fp8_t, *a.fp8, dtype, M, N, device, op, names);
  } else {
    require(a.out, dtype, device, op, "out");
    require_numel(a.out, a.in.numel(), op, "out");
    KILN_CHECK(a.out_fp8_t.empty(), "{}: argument 'out_fp8_t' is given without 'fp8'", op);
  }
  return a.in.numel();
}

namespace {
// An elementwise op's backward: din and dout like `saved`, the forward's input or output (named
// `saved_name`), whose dtype is the compute dtype.
int64_t elementwise_backward(const Tensor& din, const Tensor& saved, const Tensor& dout, Device device,
                             const char* op, const char* saved_name) {
  const DType dtype = compute_dtype(saved, device, op, saved_name);
  require(din, dtype, device, op, "din");
  require(dout, dtype, device, op, "dout");
  require_numel(din, saved.numel(), op, "din");
  require_numel(dout, saved.numel(), op, "dout");
  return saved.numel();
}
}  // namespace

int64_t gelu_backward(const GeluBackward& a, Device device) {
  return elementwise_backward(a.din, a.in, a.dout, device, "gelu_backward", "in");
}

int64_t tanh_forward(const TanhForward& a, Device device) {
  constexpr const char* op = "tanh_forward";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  require(a.out, dtype, device, op, "out");
  require_numel(a.out, a.in.numel(), op, "out");
  return a.in.numel();
}

int64_t tanh_backward(const TanhBackward& a, Device device) {
  return elementwise_backward(a.din, a.out, a.dout, device, "tanh_backward", "out");
}

namespace {
// One position of [B, T, C] `sequences` and its rows [B, C] `rows` (ops.h, GatherRows), named
// `sequences_name` and `rows_name` in the errors; the compute dtype is the sequences'.
EmbeddingDims gathered_rows(const Tensor& sequences, const Tensor& rows, int64_t position, Device device,
                            const char* op, const char* sequences_name, const char* rows_name) {
  const DType dtype = compute_dtype(sequences, device, op, sequences_name);
  require(rows, dtype, device, op, rows_name);
  KILN_CHECK(sequences.shape.rank == 3, "{}: argument '{}' must be [B, T, C], got {}", op, sequences_name,
             sequences.shape.to_string());
  const EmbeddingDims dims{sequences.shape[0], sequences.shape[1], sequences.shape[2]};
  KILN_CHECK(rows.shape.rank == 2 && rows.shape[0] == dims.B && rows.shape[1] == dims.C,
             "{}: argument '{}' must be [B, C] = [{}, {}], got {}", op, rows_name, dims.B, dims.C,
             rows.shape.to_string());
  KILN_CHECK(position >= 0 && position < dims.T, "{}: position {} is outside [0, {}) of '{}' {}", op, position,
             dims.T, sequences_name, sequences.shape.to_string());
  return dims;
}
}  // namespace

EmbeddingDims gather_rows(const GatherRows& a, Device device) {
  return gathered_rows(a.in, a.out, a.position, device, "gather_rows", "in", "out");
}

EmbeddingDims gather_rows_backward(const GatherRowsBackward& a, Device device) {
  return gathered_rows(a.din, a.dout, a.position, device, "gather_rows_backward", "din", "dout");
}

RowsDims mask_rows(const MaskRows& a, Device device) {
  constexpr const char* op = "mask_rows";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  require(a.out, dtype, device, op, "out");
  require(a.keep, DType::I32, device, op, "keep");
  require_numel(a.out, a.in.numel(), op, "out");
  const int64_t M = a.keep.numel();
  KILN_CHECK(M > 0 && a.in.numel() % M == 0, "{}: argument 'in' {} does not split into the {} rows of 'keep' {}", op,
             a.in.shape.to_string(), M, a.keep.shape.to_string());
  return {M, a.in.numel() / M};
}

namespace {
void require_key_mask(const Tensor& key_mask, AttentionMask mask, const AttentionShape& s, Device device,
                      const char* op) {
  if (mask == AttentionMask::Causal) return;
  require(key_mask, DType::I32, device, op, "key_mask");
  require_numel(key_mask, s.B * s.T, op, "key_mask");
}

void require_attention_dropout(const AttentionDropout& dropout, const char* op) {
  KILN_CHECK(dropout.probability >= 0.0f && dropout.probability < 1.0f,
             "{}: dropout probability must be in [0, 1), got {}", op, dropout.probability);
}

}  // namespace

AttentionShape attention_forward(const AttentionForward& a, Device device) {
  constexpr const char* op = "attention_forward";
  const DType dtype = compute_dtype(a.qkv, device, op, "qkv");
  require(a.out, dtype, device, op, "out");
  require(a.lse, DType::F32, device, op, "lse");
  const AttentionShape s = attention_shape(a.qkv, a.num_heads, op);
  require_numel(a.out, s.B * s.T * s.C, op, "out");
  require_numel(a.lse, s.B * s.NH * s.T, op, "lse");
  require_key_mask(a.key_mask, a.mask, s, device, op);
  require_attention_dropout(a.dropout, op);
  if (a.fp8) {  // the output cast too (ops.h)
    const int64_t M = s.B * s.T;
    require_castable(dtype, M, s.C, op, "an output", "B*T and C");
    require_fp8_operand(*a.fp8, device, op, {"fp8 scale", "fp8 scale_inv", "fp8 amax"});
    require_codes_matrix(a.out_fp8, DType::F8E4M3, M, s.C, device, op, "out_fp8", "[B*T, C]");
    if (!a.out_fp8_t.empty())
      require_codes_matrix(a.out_fp8_t, DType::F8E4M3, s.C, M, device, op, "out_fp8_t", "[C, B*T]");
  } else {
    KILN_CHECK(a.out_fp8.empty() && a.out_fp8_t.empty(), "{}: fp8 codes of the output are given without 'fp8'", op);
  }
  return s;
}

AttentionShape attention_backward(const AttentionBackward& a, Device device) {
  constexpr const char* op = "attention_backward";
  const DType dtype = compute_dtype(a.qkv, device, op, "qkv");
  for (auto [tensor, name] : {std::pair{&a.dout, "dout"}, {&a.out, "out"}})
    require(*tensor, dtype, device, op, name);
  require(a.lse, DType::F32, device, op, "lse");
  const AttentionShape s = attention_shape(a.qkv, a.num_heads, op);
  if (a.fp8) {
    KILN_CHECK(a.dqkv.empty(), "{}: argument 'dqkv' is given with 'fp8' (the gradient is only cast)", op);
  } else {
    require(a.dqkv, dtype, device, op, "dqkv");
    require_numel(a.dqkv, s.B * s.T * 3 * s.C, op, "dqkv");
  }
  require_numel(a.dout, s.B * s.T * s.C, op, "dout");
  require_numel(a.out, s.B * s.T * s.C, op, "out");
  require_numel(a.lse, s.B * s.NH * s.T, op, "lse");
  require_key_mask(a.key_mask, a.mask, s, device, op);
  require_attention_dropout(a.dropout, op);
  if (a.fp8) {
    require_gradient_codes(*a.fp8, dtype, s.B * s.T, 3 * s.C, a.dqkv_fp8, a.dqkv_fp8_t, a.dbias, device, op,
                           {"a gradient", "B*T and 3C", "dqkv_fp8", "[B*T, 3C]", "dqkv_fp8_t", "[3C, B*T]", "dbias"});
  } else {
    KILN_CHECK(a.dqkv_fp8.empty() && a.dqkv_fp8_t.empty() && a.dbias.empty(),
               "{}: fp8 codes of dqkv or a bias gradient are given without 'fp8'", op);
  }
  return s;
}

RowsDims softmax_cross_entropy(const SoftmaxCrossEntropy& a, Device device) {
  constexpr const char* op = "softmax_cross_entropy";
  compute_dtype(a.logits, device, op, "logits");
  require(a.losses, DType::F32, device, op, "losses");
  require(a.targets, DType::I32, device, op, "targets");
  KILN_CHECK(a.logits.shape.rank == 2, "{}: logits must be [M, Vp], got {}", op, a.logits.shape.to_string());
  const RowsDims dims{a.logits.shape[0], a.logits.shape[1]};
  KILN_CHECK(a.vocab_size > 0 && a.vocab_size <= dims.C, "{}: vocab_size {} outside (0, {}]", op, a.vocab_size,
             dims.C);
  require_numel(a.losses, dims.M, op, "losses");
  require_numel(a.targets, dims.M, op, "targets");
  if (a.fp8) {  // the gradient cast for the classifier's fp8 backward (ops.h)
    KILN_CHECK(a.write_grad, "{}: argument 'fp8' is given without write_grad (it casts the gradient)", op);
    require_gradient_codes(*a.fp8, a.logits.dtype, dims.M, dims.C, a.grad_fp8, a.grad_fp8_t, Tensor{}, device, op,
                           {"the logits' gradient", "rows and padded vocabulary", "grad_fp8", "[M, Vp]", "grad_fp8_t",
                            "[Vp, M]", "dbias"});
  } else {
    KILN_CHECK(a.grad_fp8.empty() && a.grad_fp8_t.empty(), "{}: fp8 codes of the gradient are given without 'fp8'",
               op);
  }
  return dims;
}

int64_t adamw_step(const AdamwStep& a, Device device) {
  constexpr const char* op = "adamw_step";
  require(a.master, DType::F32, device, op, "master");
  require(a.grad, DType::F32, device, op, "grad");
  require(a.exp_avg, DType::F32, device, op, "exp_avg");
  require(a.exp_avg_sq, DType::F32, device, op, "exp_avg_sq");
  KILN_CHECK(!a.param_out.empty(), "{}: argument 'param_out' is missing", op);
  const int64_t count = a.master.numel();
  for (auto [tensor, name] : {std::pair{&a.grad, "grad"}, {&a.exp_avg, "exp_avg"}, {&a.exp_avg_sq, "exp_avg_sq"},
                              {&a.param_out, "param_out"}})
    require_numel(*tensor, count, op, name);
  KILN_CHECK(a.step >= 1, "{}: step must be >= 1, got {}", op, a.step);
  const DType out = a.param_out.dtype;
  KILN_CHECK(out == DType::F32 || out == DType::BF16 || out == DType::F16,
             "{}: param_out dtype {} is not a floating type", op, dtype_name(out));
  for (const AdamwSegment& segment : a.segments)
    KILN_CHECK(segment.offset >= 0 && segment.count >= 0 && segment.offset + segment.count <= count,
               "{}: segment [{}, {}) outside {} parameters", op, segment.offset, segment.offset + segment.count, count);
  return count;
}

int64_t sum_of_squares(const SumOfSquares& a, Device device) {
  require(a.in, DType::F32, device, "sum_of_squares", "in");
  return a.in.numel();
}

int64_t dropout(const Dropout& a, Device device) {
  constexpr const char* op = "dropout";
  const DType dtype = compute_dtype(a.in, device, op, "in");
  require(a.out, dtype, device, op, "out");
  require_numel(a.out, a.in.numel(), op, "out");
  if (!a.residual.empty()) {
    require(a.residual, dtype, device, op, "residual");
    require_numel(a.residual, a.in.numel(), op, "residual");
  }
  KILN_CHECK(a.probability >= 0.0f && a.probability < 1.0f, "{}: probability must be in [0, 1), got {}", op,
             a.probability);
  return a.in.numel();
}

int64_t fill(const Fill& a, Device device) {
  compute_dtype(a.out, device, "fill", "out");
  return a.out.numel();
}

int64_t convert(const Convert& a, Device device) {
  constexpr const char* op = "convert";
  if (a.fp8) {  // to fp8 codes (ops.h): a matrix, in both layouts or either
    const DType dtype = compute_dtype(a.in, device, op, "in");
    KILN_CHECK(a.in.shape.rank == 2, "{}: a cast to fp8 takes a matrix [R, C], got 'in' {}", op,
               a.in.shape.to_string());
    const int64_t R = a.in.shape[0], C = a.in.shape[1];
    require_castable(dtype, R, C, op, "a matrix", "R and C");
    require_fp8_operand(*a.fp8, device, op, {"fp8 scale", "fp8 scale_inv", "fp8 amax"});
    KILN_CHECK(!a.out.empty() || !a.out_t.empty(), "{}: 'fp8' is given without 'out' or 'out_t' (the codes go nowhere)",
               op);
    if (!a.out.empty()) require_codes_matrix(a.out, DType::F8E4M3, R, C, device, op, "out", "[R, C]");
    if (!a.out_t.empty()) require_codes_matrix(a.out_t, DType::F8E4M3, C, R, device, op, "out_t", "[C, R]");
    return a.in.numel();
  }
  KILN_CHECK(a.out_t.empty(), "{}: argument 'out_t' is given without 'fp8'", op);
  compute_dtype(a.out, device, op, "out");
  compute_dtype(a.in, device, op, "in");
  require_numel(a.in, a.out.numel(), op, "in");
  return a.out.numel();
}

int64_t fp8_update_scales(const Fp8UpdateScales& a, Device device) {
  constexpr const char* op = "fp8_update_scales";
  require(a.state, DType::F32, device, op, "state");
  KILN_CHECK(a.state.shape.rank == 2 && a.state.shape[1] > kFp8StateColumns,
             "{}: state must be [tensors, {} + history] with a history of at least 1, got {}", op, kFp8StateColumns,
             a.state.shape.to_string());
  const int64_t history = a.state.shape[1] - kFp8StateColumns;
  KILN_CHECK(a.position >= 0 && a.position < history, "{}: history position {} is outside [0, {})", op, a.position,
             history);
  KILN_CHECK(a.margin >= 0, "{}: margin {} is negative", op, a.margin);
  return history;
}

}  // namespace kiln::checks
