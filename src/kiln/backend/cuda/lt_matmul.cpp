#include "kiln/backend/cuda/lt_matmul.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "kiln/backend/cuda/cublaslt_library.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/lt_matmul_tuning.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/error.h"

namespace kiln::cuda {
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  KILN_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in {}: {}", what,
             cublaslt().cublasLtGetStatusString(status));
}

cudaDataType lt_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    default: fail("cuBLASLt products take fp32, bf16, fp16 or fp8, not {}", dtype_name(dtype));
  }
}

// fp32 inputs: strict fp32 unless tf32; bf16/fp16 inputs: tensor cores with fp32 accumulation.
cublasComputeType_t compute_type(const GemmTypes& types) {
  return types.inputs == DType::F32 && types.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::Dgelu: return CUBLASLT_EPILOGUE_DGELU;
    // cuBLASLt is column-major: it computes C^T = op(B)^T op(A)^T, so our B is its A (below).
    case GemmEpilogue::BiasGradFromB: return CUBLASLT_EPILOGUE_BGRADA;
    case GemmEpilogue::BiasGradFromA: return CUBLASLT_EPILOGUE_BGRADB;
  }
  fail("unknown matmul epilogue");
}

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment classes).
int64_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  return address == 0 ? 256 : std::min<int64_t>(256, int64_t{1} << std::countr_zero(address));
}

// The C beta multiplies: the addend where one is given, else the output itself.
const void* addend_of(const Gemm& g) { return g.addend ? g.addend : g.C; }

// A product as the errors name it: "the M x N x K product (...)".
std::string describe(const Gemm& g) {
  return fmt::format(
      "the {} x {} x {} product (trans_a {}, trans_b {}, lda {}, ldb {}, ldc {}, batch {}; {} x {} inputs, {} "
      "output; epilogue {}; beta {}{}; A, B, C aligned to {}, {}, {} bytes; scales {}/{}{})",
      g.M, g.N, g.K, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc, g.batch, dtype_name(g.types.inputs),
      dtype_name(g.types.b()), dtype_name(g.types.output), static_cast<int>(g.epilogue), g.beta,
      g.addend ? " with an addend" : "", alignment(g.A), alignment(g.B), alignment(g.C), g.a_scale != nullptr,
      g.b_scale != nullptr, g.fast_accumulation ? "; fast accumulation" : "");
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check_lt(cublaslt().cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
           "cublasLtMatmulDescSetAttribute");
}

// The device pointers a call brings besides its matrices: the plan is made with the first call's
// (the heuristic sees them) and every call sets its own. cuBLASLt is column-major and its A is our
// B, so our a_scale is its B's and our b_scale its A's.
void set_pointers(cublasLtMatmulDesc_t desc, const Gemm& g) {
  if (g.bias) set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.bias_grad) set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias_grad));
  if (g.aux) set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux));
  if (g.a_scale) set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale));
  if (g.b_scale) set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale));
}

// A stored row-major rows x cols matrix (row stride ld) is, to cuBLASLt, column-major cols x rows.
cublasLtMatrixLayout_t layout(DType dtype, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t result = nullptr;
  const CublasLt& lt = cublaslt();
  check_lt(lt.cublasLtMatrixLayoutCreate(&result, lt_type(dtype), static_cast<uint64_t>(cols),
                                         static_cast<uint64_t>(rows), ld),
           "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    check_lt(lt.cublasLtMatrixLayoutSetAttribute(result, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
             "cublasLtMatrixLayoutSetAttribute");
    check_lt(lt.cublasLtMatrixLayoutSetAttribute(result, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof(stride)),
             "cublasLtMatrixLayoutSetAttribute");
  }
  return result;
}

}  // namespace

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  std::vector<cublasLtMatmulAlgo_t> algorithms;  // the heuristic's, best first (one without autotune)
  size_t chosen = 0;                             // the one every call runs
  bool awaiting_timing = false;                  // autotune: more than one, not timed yet
  float first_ms = 0.0f, chosen_ms = 0.0f;       // once timed: the heuristic's first, the chosen
  GemmEpilogue epilogue = GemmEpilogue::None;
  bool supported = false;
  bool fp8 = false, fast_accumulation = false;  // its inputs; Gemm::fast_accumulation
  ~Plan() {
    if (desc) cublaslt().cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t matrix : {a, b, c})
      if (matrix) cublaslt().cublasLtMatrixLayoutDestroy(matrix);
  }
};

LtMatmul::LtMatmul(void* workspace, size_t workspace_bytes, bool autotune)
    : autotune_(autotune), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  KILN_CHECK(alignment(workspace) >= 256, "the products' workspace must be 256-byte aligned");
  cublasLtHandle_t handle = nullptr;
  check_lt(cublaslt().cublasLtCreate(&handle), "cublasLtCreate");
  handle_ = handle;
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  if (handle_) cublaslt().cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

LtMatmul::Plan& LtMatmul::plan_for(const Gemm& g) {
  const GemmTypes& t = g.types;
  PlanKey key = {g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
                 g.stride_c, static_cast<int64_t>(t.inputs), static_cast<int64_t>(t.b()),
                 static_cast<int64_t>(t.output), t.tf32, static_cast<int64_t>(g.epilogue), g.aux_ld,
                 alignment(g.A), alignment(g.B), alignment(g.C), alignment(g.bias), alignment(g.bias_grad),
                 alignment(g.aux), g.a_scale != nullptr, g.b_scale != nullptr, alignment(addend_of(g)),
                 g.fast_accumulation};
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;

  // cuBLASLt's fp8 kernels take only its "TN" layout, compute type 32F and scale type 32F
  // (cublasLtMatmul(), "To use FP8 kernels..."): in our row-major terms, A [M,K] and B [N,K].
  const auto fp8 = [](DType type) { return type == DType::F8E4M3 || type == DType::F8E5M2; };
  KILN_CHECK(fp8(t.inputs) == fp8(t.b()) && (fp8(t.inputs) || t.inputs == t.b()),
             "a product's inputs are both fp8 or both the same type, not {} and {}", dtype_name(t.inputs),
             dtype_name(t.b()));
  KILN_CHECK(!fp8(t.inputs) || (!g.trans_a && g.trans_b && !fp8(t.output) &&
                                !(t.inputs == DType::F8E5M2 && t.b() == DType::F8E5M2)),
             "an fp8 product takes A [M,K] and B [N,K] (trans_a false, trans_b true), not both E5M2, and writes "
             "a 16- or 32-bit C; got trans_a {}, trans_b {}, {} x {}, output {}", g.trans_a, g.trans_b,
             dtype_name(t.inputs), dtype_name(t.b()), dtype_name(t.output));
  KILN_CHECK(!g.fast_accumulation || fp8(t.inputs), "fast accumulation is for fp8 products, not {} inputs",
             dtype_name(t.inputs));
  auto plan = std::make_unique<Plan>();
  plan->epilogue = g.epilogue;
  plan->fp8 = fp8(t.inputs);
  plan->fast_accumulation = g.fast_accumulation;
  check_lt(cublaslt().cublasLtMatmulDescCreate(&plan->desc, compute_type(t), CUDA_R_32F), "cublasLtMatmulDescCreate");
  // C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's A is our B, its B our A, each transposed as we say.
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(lt_epilogue(g.epilogue)));
  set_pointers(plan->desc, g);
  if (g.aux) set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
  if (g.fast_accumulation) set(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(1));
  plan->a = g.trans_b ? layout(t.b(), g.N, g.K, g.ldb, g.batch, g.stride_b)
                      : layout(t.b(), g.K, g.N, g.ldb, g.batch, g.stride_b);
  plan->b = g.trans_a ? layout(t.inputs, g.K, g.M, g.lda, g.batch, g.stride_a)
                      : layout(t.inputs, g.M, g.K, g.lda, g.batch, g.stride_a);
  plan->c = layout(t.output, g.M, g.N, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublaslt().cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  auto set_preference = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
    check_lt(cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)),
             "cublasLtMatmulPreferenceSetAttribute");
  };
  set_preference(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes_));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(alignment(g.B)));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(alignment(g.A)));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(alignment(addend_of(g))));
  set_preference(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(alignment(g.C)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(autotune_ ? kTuningCandidates : 1);
  int found_count = 0;
  const cublasStatus_t status = cublaslt().cublasLtMatmulAlgoGetHeuristic(
      static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b, plan->c, plan->c, preference,
      static_cast<int>(results.size()), results.data(), &found_count);
  cublaslt().cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < std::min(found_count, static_cast<int>(results.size())); ++i)
      if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
        plan->algorithms.push_back(results[static_cast<size_t>(i)].algo);
  plan->supported = !plan->algorithms.empty();
  plan->awaiting_timing = plan->algorithms.size() > 1;
  KILN_CHECK(plan->supported || g.epilogue != GemmEpilogue::None, "cuBLASLt has no algorithm for {}: {}{}",
             describe(g),
             status == CUBLAS_STATUS_SUCCESS ? "no heuristic result" : cublaslt().cublasLtGetStatusString(status),
             g.fast_accumulation ? " (--no-fp8-fast-accumulation runs the fp8 forward products without it)" : "");
  return *plans_.emplace(std::move(key), std::move(plan)).first->second;
}

LtMatmul::PlanCounts LtMatmul::plan_counts() const {
  PlanCounts counts;
  for (const auto& [key, plan] : plans_) {
    if (plan->epilogue == GemmEpilogue::None) ++counts.plain;
    else if (plan->supported) ++counts.fused;
    else ++counts.fell_back;
    counts.fp8 += plan->fp8;
    counts.fast_accumulation += plan->fast_accumulation;
    if (plan->algorithms.size() > 1 && !plan->awaiting_timing) {
      ++counts.timed;
      if (plan->chosen != 0) ++counts.changed;
      if (std::isfinite(plan->first_ms) && plan->chosen_ms > 0.0f && plan->first_ms > plan->chosen_ms)
        counts.best_speedup = std::max(counts.best_speedup, static_cast<double>(plan->first_ms / plan->chosen_ms));
    }
  }
  return counts;
}

int LtMatmul::launch(const Plan& plan, size_t index, const Gemm& g) {
  return cublaslt().cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.desc, &g.alpha, g.B, plan.a, g.A,
                                   plan.b, &g.beta, addend_of(g), plan.c, g.C, plan.c, &plan.algorithms[index],
                                   workspace_, workspace_bytes_, compute_stream());
}

void LtMatmul::choose_by_timing(Plan& plan, const Gemm& g) {
  plan.awaiting_timing = false;
  const std::vector<float> times = time_candidates(plan.algorithms.size(), kTuningRounds, [&](size_t index) {
    return launch(plan, index, g) == CUBLAS_STATUS_SUCCESS;
  });
  // None ran: the call keeps the heuristic's first, whose refusal it then handles as without timing.
  const size_t chosen = chosen_candidate(times, kTuningMargin).value_or(0);
  plan.chosen = chosen;
  plan.first_ms = times[0];
  plan.chosen_ms = times[chosen];
}

bool LtMatmul::run(const Gemm& product) {
  KILN_CHECK(product.epilogue != GemmEpilogue::Dgelu || product.beta == 0.0f,
             "the GELU-gradient epilogue writes its output");
  KILN_CHECK(alignment(product.a_scale) >= 16 && alignment(product.b_scale) >= 16,
             "fp8 scale factors must be 16-byte aligned for cuBLASLt; A's is aligned to {} bytes, B's to {}, for {}",
             alignment(product.a_scale), alignment(product.b_scale), describe(product));
  if (product.M == 0 || product.N == 0) return true;
  Plan& plan = plan_for(product);
  if (!plan.supported) return false;
  set_pointers(plan.desc, product);  // the plan was made with this call's pointers' alignments
  // Timed in place, so only on a call that running again does not change (an accumulating one is not),
  // and not inside a capture, which its waits would invalidate (a plan first met there is timed later).
  if (plan.awaiting_timing && product_repeats_exactly(product) && !compute_stream_capturing())
    choose_by_timing(plan, product);
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  {
    const TimedLaunch timed("cuBLASLt product");
    status = static_cast<cublasStatus_t>(launch(plan, plan.chosen, product));
  }
  if (status == CUBLAS_STATUS_NOT_SUPPORTED && product.epilogue != GemmEpilogue::None) {
    plan.supported = false;  // the heuristic offered an algorithm the call then refused: fall back from now on
    return false;
  }
  KILN_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in cublasLtMatmul: {}, for {}",
             cublaslt().cublasLtGetStatusString(status), describe(product));
  return true;
}

}  // namespace kiln::cuda
