// The cuBLASLt calls kiln makes (cuda/lt_matmul.cpp), defined for the CPU emulator under their real
// names and signatures (checked against the toolkit's cublasLt.h, included here), so the CUDA
// back-end compiled by the host compiler links against this instead of libcublasLt.
//
// Semantics as cuBLASLt documents them: column-major D = alpha op(A) op(B) + beta C with strided
// batches; fp32, bf16, fp16 and fp8 inputs (E4M3 and E5M2, not both E5M2, only in the "TN"
// layout with compute type 32F and a 16- or 32-bit D, with optional A and B scale pointers: its
// documented requirements; other fp8 calls are invalid here, and the heuristic offers nothing for
// fp8 matrices less than 16-byte aligned or rows not a multiple of 16 bytes; a call whose scale
// pointers are less than 16-byte aligned is refused, as an H100 refused it); and
// the epilogues kiln uses: BIAS (bias[i] added to row i of D), GELU_AUX_BIAS (aux = the biased
// result before GELU, D = gelu(aux)), DGELU (D = result * gelu'(aux)), BGRADA and BGRADB (the
// bias gradient: sums of op(A)'s rows or op(B)'s columns over k, written). Bias, bias gradient
// and aux have D's type. Products accumulate in double from inputs widened exactly (TF32
// compute rounds fp32 inputs to 10 mantissa bits first); D is rounded once. A call whose layouts do
// not fit its dimensions, whose leading dimensions are too small, or whose pointers are less
// aligned than the heuristic was promised fails with CUBLAS_STATUS_INVALID_VALUE, as a misuse
// would fault or fail on a GPU.
//
// Not known here, so not checked: which algorithms real cuBLASLt offers for an epilogue (here every
// one, unless a test refuses them with cuda_emulator::set_cublaslt_epilogues to run kiln's
// fallbacks), how many algorithms it offers and how fast each is (here one, unless a test sets
// several with cuda_emulator::set_cublaslt_algorithms to see kiln choose by timing), and which
// GELU its epilogues compute (the documentation does not say; this uses the tanh form kiln's ops
// use), and what fp8 fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM) loses (not documented:
// here the same result, the calls counted for cuda_emulator::cublaslt_fast_accumulation_runs).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda_emulator.h"
#include "kiln/core/dtype.h"

namespace {

cuda_emulator::Epilogues epilogues_offered = cuda_emulator::Epilogues::Offered;
std::vector<double> algorithm_ms = {0.0};      // cuda_emulator::set_cublaslt_algorithms
std::vector<int64_t> algorithm_runs = {0};
int64_t fast_accumulation_runs = 0;  // cuda_emulator::cublaslt_fast_accumulation_runs

bool has_epilogue(uint32_t epilogue) { return epilogue != CUBLASLT_EPILOGUE_DEFAULT; }

struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Desc {
  cublasComputeType_t compute;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  const float* a_scale = nullptr;  // fp8: device factors of op(A), op(B), read when the product runs
  const float* b_scale = nullptr;
  int8_t fast_accumulation = 0;  // fp8: counted (cuda_emulator::cublaslt_fast_accumulation_runs)
};

struct Preference {
  uint64_t workspace_bytes = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};

template <typename Handle>
Desc& desc(Handle handle) {
  return *reinterpret_cast<Desc*>(handle);
}
template <typename Handle>
Layout& layout(Handle handle) {
  return *reinterpret_cast<Layout*>(handle);
}

template <typename T>
bool read(T& value, const void* buffer, size_t bytes) {
  if (bytes != sizeof(T)) return false;
  std::memcpy(&value, buffer, sizeof(T));
  return true;
}

bool fp8(cudaDataType type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }
size_t type_bytes(cudaDataType type) { return type == CUDA_R_32F ? 4 : fp8(type) ? 1 : 2; }
bool known_type(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F || fp8(type);
}

double load(cudaDataType type, const void* data, int64_t index) {
  switch (type) {
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[index]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(data)[index]);
    case CUDA_R_8F_E4M3: return kiln::fp8_e4m3_to_float(static_cast<const uint8_t*>(data)[index]);
    case CUDA_R_8F_E5M2: return kiln::fp8_e5m2_to_float(static_cast<const uint8_t*>(data)[index]);
    default: return static_cast<const float*>(data)[index];
  }
}

void store(cudaDataType type, void* data, int64_t index, double value) {
  const auto single = static_cast<float>(value);
  switch (type) {
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(data)[index] = __float2bfloat16_rn(single); break;
    case CUDA_R_16F: static_cast<__half*>(data)[index] = __float2half_rn(single); break;
    default: static_cast<float*>(data)[index] = single;
  }
}

// fp32 rounded to TF32 (10 mantissa bits, to nearest even), as tensor cores read it.
double tf32(double value) {
  auto single = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &single, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0xfffu + ((bits >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&single, &bits, 4);
  return single;
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016), and its derivative.
double gelu(double x) {
  const double inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(inner));
}
double gelu_derivative(double x) {
  const double inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(inner);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

bool aligned(const void* pointer, uint32_t alignment) {
  return alignment == 0 || reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// The op(X) dimensions of a layout: (rows, cols) as stored, swapped when transposed.
void op_shape(const Layout& x, int32_t trans, uint64_t& rows, uint64_t& cols) {
  rows = trans == CUBLAS_OP_N ? x.rows : x.cols;
  cols = trans == CUBLAS_OP_N ? x.cols : x.rows;
}

bool fits(const Layout& x) { return known_type(x.type) && x.ld >= static_cast<int64_t>(x.rows) && x.batch >= 1; }

// Whether the descriptors describe a product cuBLASLt would accept.
bool consistent(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& out) {
  uint64_t m, k, k_b, n;
  op_shape(a, d.trans_a, m, k);
  op_shape(b, d.trans_b, k_b, n);
  // fp8 inputs: both fp8, not both E5M2, cuBLASLt's "TN" layout only, a 16- or 32-bit C and D,
  // compute type 32F. Other inputs: one type for both.
  const bool types_ok =
      fp8(a.type) || fp8(b.type)
          ? fp8(a.type) && fp8(b.type) && !(a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2) &&
                d.trans_a == CUBLAS_OP_T && d.trans_b == CUBLAS_OP_N && d.compute == CUBLAS_COMPUTE_32F &&
                !fp8(c.type) && !fp8(out.type)
          : a.type == b.type && !d.a_scale && !d.b_scale;
  return types_ok && fits(a) && fits(b) && fits(c) && fits(out) && k == k_b && c.rows == m && c.cols == n &&
         out.rows == m && out.cols == n && a.batch == out.batch && b.batch == out.batch && c.batch == out.batch;
}

// The product and its epilogue, as the stream runs it (defined after the API).
void multiply(const Desc& op, const Layout& a, const void* a_data, const Layout& b,
              const void* b_data, float alpha, float beta, const Layout& c, const void* c_data,
              const Layout& out, void* d_data);

}  // namespace

extern "C" {

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulator)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulator)";
    default: return "cuBLASLt error (emulator)";
  }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(new char);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<char*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* result, cublasComputeType_t compute, cudaDataType_t scale) {
  if (scale != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *result = reinterpret_cast<cublasLtMatmulDesc_t>(new Desc{compute});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t handle) {
  delete &desc(handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t handle, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
  Desc& d = desc(handle);
  bool ok = false;
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = read(d.trans_a, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = read(d.trans_b, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = read(d.epilogue, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = read(d.bias, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = read(d.aux, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = read(d.aux_ld, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: ok = read(d.a_scale, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: ok = read(d.b_scale, buffer, bytes); break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: ok = read(d.fast_accumulation, buffer, bytes); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;  // an attribute kiln does not set
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* result, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  *result = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t handle) {
  delete &layout(handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t handle, cublasLtMatrixLayoutAttribute_t attribute,
                                                const void* buffer, size_t bytes) {
  Layout& x = layout(handle);
  bool ok = false;
  switch (attribute) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = read(x.batch, buffer, bytes); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = read(x.stride, buffer, bytes); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* result) {
  *result = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t handle) {
  delete reinterpret_cast<Preference*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t handle,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, const void* buffer,
                                                    size_t bytes) {
  auto& p = *reinterpret_cast<Preference*>(handle);
  bool ok = false;
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = read(p.workspace_bytes, buffer, bytes); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ok = read(p.alignment[0], buffer, bytes); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ok = read(p.alignment[1], buffer, bytes); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ok = read(p.alignment[2], buffer, bytes); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ok = read(p.alignment[3], buffer, bytes); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

// One algorithm for every consistent product; it remembers the alignments it was promised, which
// cublasLtMatmul then holds the pointers to.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t operation, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t preference,
                                              int requested, cublasLtMatmulHeuristicResult_t results[], int* count) {
  *count = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  const Desc& op = desc(operation);
  if (!consistent(op, layout(a), layout(b), layout(c), layout(d))) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_epilogue(op.epilogue) && epilogues_offered == cuda_emulator::Epilogues::NoAlgorithm)
    return CUBLAS_STATUS_SUCCESS;
  const bool gelu_aux = op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || op.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (gelu_aux && op.aux_ld % 8 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // cuBLASLt asks aux ld % 8 == 0
  const auto& p = *reinterpret_cast<const Preference*>(preference);
  if (fp8(layout(a).type)) {  // fp8 kernels: 16-byte-aligned matrices and fp8 rows
    for (uint32_t promised : p.alignment)
      if (promised < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const Layout* x : {&layout(a), &layout(b)})
      if (x->ld % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // An algorithm: the alignments promised (16 bytes), then its index among algorithm_ms.
  *count = std::min(requested, static_cast<int>(algorithm_ms.size()));
  for (int i = 0; i < *count; ++i) {
    results[i] = cublasLtMatmulHeuristicResult_t{};
    std::memcpy(results[i].algo.data, p.alignment, sizeof(p.alignment));
    results[i].algo.data[2] = static_cast<uint64_t>(i);
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].wavesCount = 1.0f;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t operation,
                              const void* alpha_pointer, const void* a_data,
                              cublasLtMatrixLayout_t a_layout, const void* b_data,
                              cublasLtMatrixLayout_t b_layout, const void* beta_pointer,
                              const void* c_data, cublasLtMatrixLayout_t c_layout, void* d_data,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void*, size_t, cudaStream_t stream) {
  // Copies: the call is what CUDA's is, whatever the descriptors say by the time the stream runs
  // it.
  const Desc op = desc(operation);
  const Layout a = layout(a_layout), b = layout(b_layout), c = layout(c_layout),
               out = layout(d_layout);
  if (!algo || !consistent(op, a, b, c, out)) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_epilogue(op.epilogue) && epilogues_offered == cuda_emulator::Epilogues::RefusedWhenRun)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  uint32_t alignment[4];
  std::memcpy(alignment, algo->data, sizeof(alignment));
  if (!aligned(a_data, alignment[0]) || !aligned(b_data, alignment[1]) || !aligned(c_data, alignment[2]) ||
      !aligned(d_data, alignment[3]))
    return CUBLAS_STATUS_INVALID_VALUE;
  // Inferred from an H100 (cuBLAS 13.0, 2026-11-25), not documented: fp8 products whose scale
  // pointers were 4 bytes into 16 were refused when run, the same forms with aligned ones ran.
  if (!aligned(op.a_scale, 16) || !aligned(op.b_scale, 16)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool bias = op.epilogue == CUBLASLT_EPILOGUE_BIAS || op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux = op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || op.epilogue == CUBLASLT_EPILOGUE_DGELU;
  const bool bias_grad = op.epilogue == CUBLASLT_EPILOGUE_BGRADA || op.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  if ((bias || bias_grad) && !op.bias) return CUBLAS_STATUS_INVALID_VALUE;
  if (aux && !op.aux) return CUBLAS_STATUS_INVALID_VALUE;
  if (out.batch > 1 && (bias || aux || bias_grad)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto index = static_cast<size_t>(algo->data[2]);
  if (index >= algorithm_ms.size()) return CUBLAS_STATUS_INVALID_VALUE;
  if (algorithm_ms[index] < 0.0) return CUBLAS_STATUS_NOT_SUPPORTED;
  ++algorithm_runs[index];
  if (op.fast_accumulation) ++fast_accumulation_runs;

  const float alpha = *static_cast<const float*>(alpha_pointer), beta = *static_cast<const float*>(beta_pointer);
  const auto extra = std::chrono::duration<double, std::milli>(algorithm_ms[index]);
  cuda_emulator::submit(stream, [=] {
    multiply(op, a, a_data, b, b_data, alpha, beta, c, c_data, out, d_data);
    if (extra.count() > 0.0) std::this_thread::sleep_for(extra);
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace {

void multiply(const Desc& op, const Layout& a, const void* a_data, const Layout& b,
              const void* b_data, float alpha, float beta, const Layout& c, const void* c_data,
              const Layout& out, void* d_data) {
  const bool bias =
      op.epilogue == CUBLASLT_EPILOGUE_BIAS || op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool round_tf32 = op.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type == CUDA_R_32F;
  uint64_t m, k, unused, n;
  op_shape(a, op.trans_a, m, k);
  op_shape(b, op.trans_b, unused, n);
  // op(X) of one batch, widened: rows x cols, row r at [r * cols].
  const auto widened = [&](const Layout& x, const void* data, int32_t trans, int64_t batch, uint64_t rows,
                           uint64_t cols) {
    std::vector<double> values(rows * cols);
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t q = 0; q < cols; ++q) {
        const auto index = batch * x.stride + static_cast<int64_t>(trans == CUBLAS_OP_N ? r + q * x.ld : q + r * x.ld);
        const double value = load(x.type, data, index);
        values[r * cols + q] = round_tf32 ? tf32(value) : value;
      }
    return values;
  };
  std::vector<double> a_op, b_op, row(n);
  // D = alpha scale_A scale_B op(A) op(B) + beta C (cuBLASLt's fp8 formula, scale_C = scale_D = 1).
  alpha *= (op.a_scale ? *op.a_scale : 1.0f) * (op.b_scale ? *op.b_scale : 1.0f);
  for (int64_t batch = 0; batch < out.batch; ++batch) {
    a_op = widened(a, a_data, op.trans_a, batch, m, k);
    b_op = widened(b, b_data, op.trans_b, batch, k, n);
    for (uint64_t i = 0; i < m; ++i) {
      std::fill(row.begin(), row.end(), 0.0);
      for (uint64_t p = 0; p < k; ++p)
        for (uint64_t j = 0; j < n; ++j) row[j] += a_op[i * k + p] * b_op[p * n + j];
      for (uint64_t j = 0; j < n; ++j) {
        double value = alpha * row[j];
        if (beta != 0.0f) value += beta * load(c.type, c_data, batch * c.stride + static_cast<int64_t>(i + j * c.ld));
        if (bias) value += load(out.type, op.bias, static_cast<int64_t>(i));
        const auto aux_index = static_cast<int64_t>(i) + static_cast<int64_t>(j) * op.aux_ld;
        if (op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
          store(out.type, const_cast<void*>(op.aux), aux_index, value);
          value = gelu(value);
        } else if (op.epilogue == CUBLASLT_EPILOGUE_DGELU) {
          value *= gelu_derivative(load(out.type, op.aux, aux_index));
        }
        store(out.type, d_data, batch * out.stride + static_cast<int64_t>(i + j * out.ld), value);
      }
    }
  }
  if (op.epilogue == CUBLASLT_EPILOGUE_BGRADA)
    for (uint64_t i = 0; i < m; ++i) {
      double sum = 0.0;
      for (uint64_t p = 0; p < k; ++p) sum += a_op[i * k + p];
      store(out.type, const_cast<void*>(op.bias), static_cast<int64_t>(i), sum);
    }
  if (op.epilogue == CUBLASLT_EPILOGUE_BGRADB)
    for (uint64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (uint64_t p = 0; p < k; ++p) sum += b_op[p * n + j];
      store(out.type, const_cast<void*>(op.bias), static_cast<int64_t>(j), sum);
    }
}

}  // namespace

void cuda_emulator::set_cublaslt_epilogues(Epilogues epilogues) { epilogues_offered = epilogues; }

void cuda_emulator::set_cublaslt_algorithms(std::vector<double> milliseconds) {
  algorithm_ms = milliseconds.empty() ? std::vector<double>{0.0} : std::move(milliseconds);
  algorithm_runs.assign(algorithm_ms.size(), 0);
}

std::vector<int64_t> cuda_emulator::cublaslt_runs_by_algorithm() { return algorithm_runs; }

int64_t cuda_emulator::cublaslt_fast_accumulation_runs() { return fast_accumulation_runs; }
