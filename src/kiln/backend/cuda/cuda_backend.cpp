#include "kiln/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/fp8_workspace.h"
#include "kiln/backend/layernorm_workspace.h"
#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/lt_matmul.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/backend/op_checks.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr Device kCuda = Device::CUDA;

using cuda::check_cuda;

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(size_t bytes, std::shared_ptr<MemoryTracker> memory) : bytes_(bytes), memory_(std::move(memory)) {
    if (cudaMalloc(&data_, bytes ? bytes : 1) != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail("out of GPU memory: could not allocate {} bytes ({:.2f} GiB); {:.2f} GiB of {:.2f} GiB free",
           bytes, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    memory_->allocated(bytes_);
  }
  ~CudaBuffer() override {
    cudaFree(data_);
    memory_->freed(bytes_);
  }
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<MemoryTracker> memory_;
};

int element_kind(DType dtype) {
  switch (dtype) {
    case DType::F32: return cuda::kFp32;
    case DType::BF16: return cuda::kBf16;
    case DType::F16: return cuda::kFp16;
    default: fail("the CUDA kernels take fp32, bf16 or fp16, not {}", dtype_name(dtype));
  }
}

// `elements` further into a tensor of `dtype` elements.
const void* at(const void* data, int64_t elements, DType dtype) {
  return static_cast<const char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}
void* at(void* data, int64_t elements, DType dtype) {
  return static_cast<char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}

static_assert(kMaxFusedAttentionHeadSize == cuda::kGeneralAttentionMaxHeadSize);

// Which attention kernels take a call (attention_workspace.h): the tensor-core tiles
// (flash_attention.h) where the dtype, head size, GPU and the tensors' 16-byte alignment suit
// them, else the general fused kernels (general_attention.h), else the materialised scores; all
// three only with a grid the fused kernels can address (B x NH blocks in y).
enum class AttentionPath { Tiled, General, Materialized };

AttentionPath attention_path(bool fused_on, int compute_major, DType dtype, int64_t B, int64_t NH, int64_t HS,
                             std::initializer_list<const void*> tensors) {
  if (!fused_on || !fused_attention_shape(dtype, HS) || B * NH > 65535) return AttentionPath::Materialized;
  for (const void* data : tensors)
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return AttentionPath::General;
  return cuda::tiled_attention_applies(element_kind(dtype), HS, compute_major) ? AttentionPath::Tiled
                                                                               : AttentionPath::General;
}

using cuda::Gemm;
using cuda::GemmEpilogue;
using cuda::GemmTypes;

// GELU inside the products (cuBLASLt's GELU epilogues) except in strict fp32: that mode is the
// reference the op table holds to fp32 rounding, and cuBLASLt does not document its GELU to that
// precision. The auxiliary matrix (the pre-activation) needs a leading dimension divisible by 8.
bool gelu_epilogue_applies(const GemmTypes& types, int64_t aux_columns) {
  return (types.inputs != DType::F32 || types.tf32) && aux_columns % 8 == 0;
}

// A product without epilogue, arguments in Gemm's order (every cuBLASLt plan takes that).
void gemm(cuda::LtMatmul& lt, GemmTypes types, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch = 1,
          int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_c = 0) {
  lt.run({types, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c});
}

}  // namespace

struct CudaBackend::Handles {
  std::unique_ptr<DeviceBuffer> matmul_workspace;
  std::unique_ptr<cuda::LtMatmul> matmul;  // every matrix product (lt_matmul.h)
  bool tf32 = false;
  bool matmul_epilogues = true;
  bool fused_attention = true;
  bool warpgroup_attention = false;  // asked for, and the device and build have it
  int compute_major = 0, compute_minor = 0;  // the device's compute capability, read once
  std::array<int64_t, 3> attention_forward_calls{};  // by AttentionPath, for run_notes()
  int64_t warpgroup_forward_calls = 0;               // of the Tiled ones, on wgmma
  std::unique_ptr<DeviceBuffer> sum_scratch;  // kSumBlocks partials + the result
  // Scratch of the ops that need it, one at a time on the stream: embedding backward's sort,
  // attention's two B x NH x T x T matrices, the partial column sums of a parameter gradient, or a
  // bias gradient from a cuBLASLt epilogue. Sized by reserve_workspace() from WorkspaceNeeds;
  // grown by an op that needs more (never during planned training).
  std::unique_ptr<DeviceBuffer> workspace;
};

CudaBackend::CudaBackend(const BackendOptions& options) : handles_(std::make_unique<Handles>()) {
  handles_->tf32 = options.tf32;
  handles_->fused_attention = options.fused_attention;
  handles_->matmul_epilogues = options.matmul_epilogues;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&handles_->compute_major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&handles_->compute_minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute");
  handles_->warpgroup_attention = options.warpgroup_attention &&
                                  cuda::warpgroup_attention_applies(handles_->compute_major, handles_->compute_minor);
  handles_->matmul_workspace = allocate(cuda::LtMatmul::kWorkspaceBytes);
  handles_->matmul = std::make_unique<cuda::LtMatmul>(handles_->matmul_workspace->data(), cuda::LtMatmul::kWorkspaceBytes);
  handles_->sum_scratch = allocate((cuda::kSumBlocks + 1) * sizeof(double));
}

CudaBackend::~CudaBackend() = default;

std::unique_ptr<DeviceBuffer> CudaBackend::allocate(size_t bytes) {
  return std::make_unique<CudaBuffer>(bytes, memory_);
}

std::optional<Backend::DeviceMemory> CudaBackend::device_memory() const {
  DeviceMemory memory;
  check_cuda(cudaMemGetInfo(&memory.free, &memory.total), "cudaMemGetInfo");
  return memory;
}

size_t CudaBackend::workspace_bytes(const WorkspaceNeeds& needs) const {
  const bool fused = attention_path(handles_->fused_attention, handles_->compute_major, needs.dtype, needs.batch,
                                    needs.heads, needs.head_size, {}) != AttentionPath::Materialized;
  const int64_t positions = needs.batch * needs.seq;
  return std::max({cuda::embedding_backward_workspace_bytes(positions),
                   attention_workspace_bytes(needs.batch, needs.heads, needs.seq, needs.dtype, fused),
                   cuda::column_sums_workspace_bytes(positions, needs.widest_row),
                   layernorm_backward_scratch_bytes(positions, needs.widest_layernorm),
                   fp8_scratch_bytes(needs.fp8_cast_bytes, positions, needs.widest_row)}) +
         fixed_workspace_bytes();
}

size_t CudaBackend::reserve_workspace(const WorkspaceNeeds& needs) {
  workspace(workspace_bytes(needs) - fixed_workspace_bytes());
  return handles_->workspace->bytes() + fixed_workspace_bytes();
}

size_t CudaBackend::fixed_workspace_bytes() const {
  return handles_->sum_scratch->bytes() + handles_->matmul_workspace->bytes();
}

void* CudaBackend::workspace(size_t bytes) {
  if (!handles_->workspace || handles_->workspace->bytes() < bytes) {
    handles_->workspace.reset();  // cudaFree waits for the kernels that still use it
    handles_->workspace = allocate(bytes);
  }
  return handles_->workspace->data();
}

std::string CudaBackend::run_notes() const {
  const cuda::LtMatmul::PlanCounts counts = handles_->matmul->plan_counts();
  const std::string products =
      handles_->matmul_epilogues
          ? fmt::format("cuBLASLt products: {} shapes with an epilogue, {} fell back to kernels (no algorithm), {} plain",
                        counts.fused, counts.fell_back, counts.plain)
          : "cuBLASLt epilogues off (--no-matmul-epilogues): bias and GELU in kernels";
  const auto& calls = handles_->attention_forward_calls;
  std::string notes = fmt::format(
      "{}; attention forward calls: {} fused on tensor cores ({} on wgmma), {} fused general, {} materialised",
      products, calls[0], handles_->warpgroup_forward_calls, calls[1], calls[2]);
  if (graph_counts_->captures > 0)  // a recorded call is counted once, however often it is replayed
    notes += fmt::format("; CUDA graphs: {} captured, {} replays (calls inside them counted once)",
                         graph_counts_->captures, graph_counts_->replays);
  return notes;
}

std::string CudaBackend::description() const {
  int device = 0;
  cudaDeviceProp properties{};
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

double CudaBackend::time_gemm_ms(DType dtype, bool tf32, int64_t M, int64_t N, int64_t K, int iterations) {
  const bool fp8 = dtype == DType::F8E4M3;
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 || fp8,
             "gemm benchmark: dtype {} is not fp32, bf16, fp16 or fp8_e4m3", dtype_name(dtype));
  KILN_CHECK(M > 0 && N > 0 && K > 0 && iterations > 0, "gemm sizes and iterations must be positive");
  KILN_CHECK(!tf32 || dtype == DType::F32, "gemm benchmark: tf32 applies to fp32 inputs only");
  KILN_CHECK(!fp8 || handles_->compute_major * 10 + handles_->compute_minor >= 89,
             "fp8 products need a GPU of compute capability 8.9 or newer (Ada, Hopper); {} is {}.{}", description(),
             handles_->compute_major, handles_->compute_minor);
  // fp8: B stored [N, K] (cuBLASLt's only fp8 layout, lt_matmul.h) and a bf16 result.
  const DType output = fp8 ? DType::BF16 : dtype;
  const size_t element = dtype_size(dtype);
  auto a = allocate(static_cast<size_t>(M * K) * element);
  auto b = allocate(static_cast<size_t>(K * N) * element);
  auto c = allocate(static_cast<size_t>(M * N) * dtype_size(output));
  if (fp8) {
    check_cuda(cuda::fill_random_fp8_e4m3(static_cast<uint8_t*>(a->data()), M * K, 1), "fill_random_fp8_e4m3");
    check_cuda(cuda::fill_random_fp8_e4m3(static_cast<uint8_t*>(b->data()), K * N, 2), "fill_random_fp8_e4m3");
  } else {
    check_cuda(cuda::fill_random(a->data(), element_kind(dtype), M * K, 1), "fill_random");
    check_cuda(cuda::fill_random(b->data(), element_kind(dtype), K * N, 2), "fill_random");
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i <= iterations; ++i) {  // the first run warms up and is not counted
    check_cuda(cudaEventRecord(start, cuda::compute_stream()), "cudaEventRecord");
    gemm(*handles_->matmul, {dtype, output, tf32}, false, fp8, M, N, K, 1.0f, a->data(), K, b->data(), fp8 ? K : N,
         0.0f, c->data(), N);
    check_cuda(cudaEventRecord(stop, cuda::compute_stream()), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i > 0) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

namespace {

// Copies on the compute stream, after the ops issued before it, and returns once it is done.
void copy_in_order(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind,
                   const char* what) {
  if (!bytes) return;
  check_cuda(cudaMemcpyAsync(destination, source, bytes, kind, cuda::compute_stream()), what);
  check_cuda(cudaStreamSynchronize(cuda::compute_stream()), what);
}

}  // namespace

void CudaBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  copy_in_order(device_dst, host_src, bytes, cudaMemcpyHostToDevice, "copy to device");
}

void CudaBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  copy_in_order(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, "copy to host");
}

// Every op is on the compute stream, so waiting for it waits for them all, and not for a batch
// copy on the stager's own stream that the next step will wait for itself (ARCHITECTURE.md 7).
void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(cuda::compute_stream()), "synchronize");
}

void CudaBackend::embedding_forward(const EmbeddingForward& a) {
  const auto [B, T, C] = checks::embedding_forward(a, kCuda);
  check_cuda(cuda::embedding_forward(a.out.data, a.tokens.as<int32_t>(), a.wte.data, a.wpe.data,
                                     element_kind(a.out.dtype), B, T, C),
             "embedding_forward");
}

void CudaBackend::embedding_backward(const EmbeddingBackward& a) {
  const auto [B, T, C] = checks::embedding_backward(a, kCuda);
  const size_t bytes = cuda::embedding_backward_workspace_bytes(B * T);
  check_cuda(cuda::embedding_backward(a.dwte.as<float>(), a.dwpe.as<float>(), a.dout.data, element_kind(a.dout.dtype),
                                      a.tokens.as<int32_t>(), B, T, C, a.dwpe.shape[0],
                                      a.dwpe_store == GradStore::Write, workspace(bytes), bytes),
             "embedding_backward");
}

// The plain kernel, or with `fp8` the one that only casts its output (ops.h).
void CudaBackend::layernorm_forward(const LayerNormForward& a) {
  const auto [M, C] = checks::layernorm_forward(a, kCuda);
  const int kind = element_kind(a.in.dtype);
  if (a.fp8)
    check_cuda(cuda::layernorm_forward_fp8(a.out_fp8.as<uint8_t>(), a.out_fp8_t.as<uint8_t>(), a.mean.as<float>(),
                                           a.rstd.as<float>(), a.in.data, a.weight.data, a.bias.data, kind, M, C,
                                           a.eps, a.fp8->scale.as<float>(), a.fp8->amax.as<float>()),
               "layernorm_forward fp8");
  else
    check_cuda(cuda::layernorm_forward(a.out.data, a.mean.as<float>(), a.rstd.as<float>(), a.in.data,
                                       a.weight.data, a.bias.data, kind, M, C, a.eps),
               "layernorm_forward");
}

void CudaBackend::layernorm_backward(const LayerNormBackward& a) {
  const auto [M, C] = checks::layernorm_backward(a, kCuda);
  check_cuda(cuda::layernorm_backward(a.din.data, a.dweight.as<float>(), a.dbias.as<float>(), a.dout.data, a.in.data,
                                      a.weight.data, element_kind(a.in.dtype), a.mean.as<float>(), a.rstd.as<float>(),
                                      M, C, a.din_store == GradStore::Write, a.param_store == GradStore::Write,
                                      workspace(layernorm_backward_scratch_bytes(M, C))),
             "layernorm_backward");
}

// Bias, GELU and their gradients go into cuBLASLt's epilogues where it has an algorithm for them
// (lt_matmul.h); otherwise the bias is broadcast into the output before an accumulating product,
// the bias gradient is a column-sum kernel, and GELU runs as its own kernel.
namespace {

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
  if (a.fp8) {  // in [M,K] and the weight as [N,K], both E4M3 (ops.h)
    Fp8Regions regions(workspace(fp8_forward_cast_bytes(M, K, N)));
    uint8_t* in8 = in_codes ? a.in.as<uint8_t>() : regions.take(M * K);
    uint8_t* weight8 = regions.take(N * K);
    if (!in_codes)  // with the kept codes too, if asked
      cast(a.in, M, K, a.fp8->in, DType::F8E4M3, in8, a.in_fp8_t.as<uint8_t>());
    if (out_in) cast(a.weight, N, K, a.fp8->weight, DType::F8E4M3, weight8, nullptr);
    else cast(a.weight, K, N, a.fp8->weight, DType::F8E4M3, nullptr, weight8);
    product = {{DType::F8E4M3, dtype}, false, true, M, N, K, 1.0f, in8, K, weight8, K, 0.0f, a.out.data, N};
    product.a_scale = a.fp8->in.scale_inv.as<float>();
    product.b_scale = a.fp8->weight.scale_inv.as<float>();
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
  if (a.gelu_fp8)
    check_cuda(cuda::cast_gelu_fp8(a.out.data, element_kind(dtype), M, N, a.gelu_fp8->scale.as<float>(),
                                   a.gelu_fp8->amax.as<float>(), a.gelu_out.as<uint8_t>(), a.gelu_out_t.as<uint8_t>()),
               "matmul_forward (gelu cast to fp8)");
}

// `product` writes din [M,K]; with gelu_in, din is then multiplied by gelu'(gelu_in): in cuBLASLt's
// DGELU epilogue where it has an algorithm for it, else in a kernel after the product.
void CudaBackend::input_gradient(const Gemm& product, const Tensor& gelu_in) {
  cuda::LtMatmul& lt = *handles_->matmul;
  const int64_t M = product.M, K = product.N;
  if (handles_->matmul_epilogues && !gelu_in.empty() && gelu_epilogue_applies(product.types, K)) {
    Gemm fused = product;
    fused.epilogue = GemmEpilogue::Dgelu;
    fused.aux = gelu_in.data;
    fused.aux_ld = K;
    if (lt.run(fused)) return;
  }
  lt.run(product);
  if (!gelu_in.empty())
    check_cuda(cuda::gelu_backward(product.C, gelu_in.data, product.C, element_kind(gelu_in.dtype), M * K),
               "matmul_backward (gelu)");
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

// fp8 backward (ops.h): dout cast to its gradient format [M,N] and transposed, the weight as [K,N]
// and `in` transposed [K,M] (or its codes as the forward kept them), all K-contiguous for
// cuBLASLt; the bias gradient from dout before its cast, summed by that cast; GELU's derivative
// as in full precision (input_gradient).
void CudaBackend::matmul_backward_fp8(const MatmulBackward& a, int64_t M, int64_t K, int64_t N) {
  const DType dtype = a.dout.dtype, grad = a.fp8->grad_dtype;
  const bool in_out = a.layout == WeightLayout::InOut;
  const bool codes_kept = !a.in_fp8_t.empty();
  cuda::LtMatmul& lt = *handles_->matmul;
  const size_t cast_bytes = fp8_backward_cast_bytes(M, K, N, codes_kept);
  auto* base = static_cast<uint8_t*>(
      workspace(cast_bytes + (a.dbias.empty() ? 0 : fp8_bias_partials_bytes(M, N))));
  // The bias gradient: dout's column sums, taken by its cast on the way (before the cast, ops.h).
  float* bias_partials = a.dbias.empty() ? nullptr : reinterpret_cast<float*>(base + cast_bytes);
  Fp8Regions regions(base);
  uint8_t* dout8 = regions.take(M * N);
  uint8_t* dout8_t = regions.take(M * N);
  uint8_t* weight8 = regions.take(K * N);
  uint8_t* in8_t = codes_kept ? a.in_fp8_t.as<uint8_t>() : regions.take(K * M);
  cast(a.dout, M, N, a.fp8->dout, grad, a.din.empty() ? nullptr : dout8, dout8_t, bias_partials);
  if (!a.din.empty()) {  // din [M,K] = dout [M,N] x (weight as [K,N])^T, then gelu'(gelu_in)
    if (in_out) cast(a.weight, K, N, a.fp8->weight, DType::F8E4M3, weight8, nullptr);
    else cast(a.weight, N, K, a.fp8->weight, DType::F8E4M3, nullptr, weight8);
    Gemm product{{grad, dtype, false, DType::F8E4M3}, false, true, M, K, N, 1.0f, dout8, N, weight8, N, 0.0f,
                 a.din.data, K};
    product.a_scale = a.fp8->dout.scale_inv.as<float>();
    product.b_scale = a.fp8->weight.scale_inv.as<float>();
    input_gradient(product, a.gelu_in);
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

void CudaBackend::gelu_forward(const GeluForward& a) {
  const int64_t count = checks::gelu_forward(a, kCuda);
  check_cuda(cuda::gelu_forward(a.out.data, a.in.data, element_kind(a.in.dtype), count), "gelu_forward");
}

void CudaBackend::gelu_backward(const GeluBackward& a) {
  const int64_t count = checks::gelu_backward(a, kCuda);
  check_cuda(cuda::gelu_backward(a.din.data, a.in.data, a.dout.data, element_kind(a.in.dtype), count),
             "gelu_backward");
}

// The flash-attention contract (ops.h). bf16/fp16 heads up to 256: fused kernels, on tensor cores
// (flash_forward.cu, flash_backward.cu) or CUDA cores (general_attention.cu); see attention_path().
// Otherwise cuBLASLt products: the T x T scores and probabilities live only in the shared workspace
// during the call (in the compute dtype, products accumulated in fp32, softmax in fp32), and
// backward recomputes them from q, k and lse. Consecutive heads are HS apart in qkv, so each batch
// entry's heads are one strided-batched GEMM.
void CudaBackend::attention_forward(const AttentionForward& a) {
  const auto [B, T, C, NH, HS] = checks::attention_forward(a, kCuda);
  const DType dtype = a.qkv.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool padded = a.mask != AttentionMask::Causal, causal = a.mask != AttentionMask::KeyPadding;
  const int32_t* key_mask = padded ? a.key_mask.as<int32_t>() : nullptr;
  const AttentionPath path =
      attention_path(handles_->fused_attention, handles_->compute_major, dtype, B, NH, HS, {a.qkv.data, a.out.data});
  ++handles_->attention_forward_calls[static_cast<size_t>(path)];
  switch (path) {
    case AttentionPath::Tiled:
      handles_->warpgroup_forward_calls += handles_->warpgroup_attention;
      check_cuda(cuda::flash_attention_forward(a.out.data, a.lse.as<float>(), a.qkv.data, key_mask,
                                               element_kind(dtype), B, T, NH, HS, causal, scale,
                                               handles_->warpgroup_attention),
                 handles_->warpgroup_attention ? "attention_forward (fused, tensor cores, wgmma)"
                                               : "attention_forward (fused, tensor cores)");
      return;
    case AttentionPath::General:
      check_cuda(cuda::general_attention_forward(a.out.data, a.lse.as<float>(), a.qkv.data, key_mask,
                                                 element_kind(dtype), B, T, NH, HS, causal, scale),
                 "attention_forward (fused, general)");
      return;
    case AttentionPath::Materialized: break;
  }
  const GemmTypes types{dtype, dtype, handles_->tf32};
  cuda::LtMatmul& lt = *handles_->matmul;
  void* probs = workspace(attention_workspace_bytes(B, NH, T, dtype, false));
  for (int64_t b = 0; b < B; ++b) {
    const void* q = at(a.qkv.data, b * T * 3 * C, dtype);
    gemm(lt, types, false, true, T, T, HS, scale, q, 3 * C, at(q, C, dtype), 3 * C, 0.0f,
         at(probs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
  }
  check_cuda(cuda::attention_softmax_forward(probs, a.lse.as<float>(), element_kind(dtype), key_mask, B, NH, T, causal),
             "attention_forward");
  for (int64_t b = 0; b < B; ++b) {
    const void* v = at(a.qkv.data, b * T * 3 * C + 2 * C, dtype);
    gemm(lt, types, false, false, T, HS, T, 1.0f, at(probs, b * NH * T * T, dtype), T, v, 3 * C, 0.0f,
         at(a.out.data, b * T * C, dtype), C, NH, T * T, HS, HS);
  }
}

void CudaBackend::attention_backward(const AttentionBackward& a) {
  const auto [B, T, C, NH, HS] = checks::attention_backward(a, kCuda);
  const DType dtype = a.qkv.dtype;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool padded = a.mask != AttentionMask::Causal, causal = a.mask != AttentionMask::KeyPadding;
  const int32_t* key_mask = padded ? a.key_mask.as<int32_t>() : nullptr;
  switch (attention_path(handles_->fused_attention, handles_->compute_major, dtype, B, NH, HS,
                         {a.qkv.data, a.dqkv.data, a.dout.data, a.out.data})) {
    case AttentionPath::Tiled:
      check_cuda(cuda::flash_attention_backward(a.dqkv.data, a.dout.data, a.qkv.data, a.out.data, a.lse.as<float>(),
                                                key_mask, element_kind(dtype), B, T, NH, HS, causal, scale,
                                                workspace(attention_workspace_bytes(B, NH, T, dtype, true)),
                                                handles_->warpgroup_attention),
                 handles_->warpgroup_attention ? "attention_backward (fused, tensor cores, wgmma)"
                                               : "attention_backward (fused, tensor cores)");
      return;
    case AttentionPath::General:
      check_cuda(cuda::general_attention_backward(a.dqkv.data, a.dout.data, a.qkv.data, a.out.data, a.lse.as<float>(),
                                                  key_mask, element_kind(dtype), B, T, NH, HS, causal, scale,
                                                  workspace(attention_workspace_bytes(B, NH, T, dtype, true))),
                 "attention_backward (fused, general)");
      return;
    case AttentionPath::Materialized: break;
  }
  const GemmTypes types{dtype, dtype, handles_->tf32};
  cuda::LtMatmul& lt = *handles_->matmul;
  void* probs = workspace(attention_workspace_bytes(B, NH, T, dtype, false));
  void* dprobs = at(probs, static_cast<int64_t>(attention_matrix_bytes(B, NH, T, dtype) / dtype_size(dtype)), dtype);
  for (int64_t b = 0; b < B; ++b) {  // S again, and dP = dO v^T
    const void* q = at(a.qkv.data, b * T * 3 * C, dtype);
    gemm(lt, types, false, true, T, T, HS, scale, q, 3 * C, at(q, C, dtype), 3 * C, 0.0f,
         at(probs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
    gemm(lt, types, false, true, T, T, HS, 1.0f, at(a.dout.data, b * T * C, dtype), C, at(q, 2 * C, dtype), 3 * C,
         0.0f, at(dprobs, b * NH * T * T, dtype), T, NH, HS, HS, T * T);
  }
  check_cuda(cuda::attention_softmax_backward(probs, dprobs, a.lse.as<float>(), a.dout.data, a.out.data,
                                              element_kind(dtype), key_mask, B, NH, T, HS, causal, scale),
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

void CudaBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  const auto [M, Vp] = checks::softmax_cross_entropy(a, kCuda);
  check_cuda(cuda::softmax_cross_entropy(a.logits.data, element_kind(a.logits.dtype), a.losses.as<float>(),
                                         a.targets.as<int32_t>(), M, a.vocab_size, Vp, a.ignore_index, a.loss_scale,
                                         a.write_grad),
             "softmax_cross_entropy");
}

void CudaBackend::adamw_step(const AdamwStep& a) {
  checks::adamw_step(a, kCuda);
  const DType out = a.param_out.dtype;
  const int out_kind = element_kind(out);
  const float bias_correction1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bias_correction2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
  for (const AdamwSegment& segment : a.segments) {
    check_cuda(cuda::adamw(a.master.as<float>(), a.param_out.data, out_kind, a.grad.as<float>(),
                           a.exp_avg.as<float>(), a.exp_avg_sq.as<float>(), segment.offset, segment.count, a.lr,
                           a.beta1, a.beta2, a.eps, segment.weight_decay, a.grad_scale, bias_correction1,
                           bias_correction2),
               "adamw_step");
  }
}

void CudaBackend::fp8_update_scales(const Fp8UpdateScales& a) {
  const int64_t history = checks::fp8_update_scales(a, kCuda);
  check_cuda(cuda::fp8_update_scales(a.state.as<float>(), a.state.shape[0], kFp8StateColumns, history, a.position,
                                     a.use_history_max, a.margin),
             "fp8_update_scales");
}

double CudaBackend::sum_of_squares(const SumOfSquares& a) {
  const int64_t count = checks::sum_of_squares(a, kCuda);
  auto* scratch = static_cast<double*>(handles_->sum_scratch->data());
  check_cuda(cuda::sum_of_squares(a.in.as<float>(), count, scratch, scratch + cuda::kSumBlocks),
             "sum_of_squares");
  double result = 0.0;
  copy_to_host(&result, scratch + cuda::kSumBlocks, sizeof(double));
  return result;
}

void CudaBackend::fill(const Fill& a) {
  const int64_t count = checks::fill(a, kCuda);
  check_cuda(cuda::fill(a.out.data, element_kind(a.out.dtype), a.value, count), "fill");
}

void CudaBackend::convert(const Convert& a) {
  const int64_t count = checks::convert(a, kCuda);
  check_cuda(cuda::convert(a.out.data, element_kind(a.out.dtype), a.in.data, element_kind(a.in.dtype), count),
             "convert");
}

}  // namespace kiln
