#include "kiln/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/fp8_workspace.h"
#include "kiln/backend/layernorm_workspace.h"
#include "kiln/backend/cuda/cuda_backend_shared.h"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/backend/op_checks.h"

// The back-end's state and the ops other than the matrix products (cuda_matmul.cpp) and attention
// (cuda_attention.cpp).
namespace kiln {

using cuda::check_cuda;
using cuda_backend::AttentionPath;
using cuda_backend::attention_path;
using cuda_backend::element_kind;
using cuda_backend::gemm;
using cuda_backend::kCuda;

namespace {

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

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options) : handles_(std::make_unique<Handles>()) {
  handles_->tf32 = options.tf32;
  handles_->fused_attention = options.fused_attention;
  handles_->matmul_epilogues = options.matmul_epilogues;
  handles_->deterministic_attention = options.deterministic_attention;
  handles_->fp8_fast_accumulation = options.fp8_fast_accumulation;
  int visible = 0;
  check_cuda(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
  KILN_CHECK(options.device_index >= 0 && options.device_index < visible,
             "--device cuda: GPU {} (this rank's local rank) does not exist: {} GPU(s) are visible; start one rank "
             "per GPU (--nproc-per-node, srun --ntasks-per-node) or check CUDA_VISIBLE_DEVICES",
             options.device_index, visible);
  check_cuda(cudaSetDevice(options.device_index), "cudaSetDevice");
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&handles_->compute_major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&handles_->compute_minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute");
  handles_->warpgroup_attention = options.warpgroup_attention &&
                                  cuda::warpgroup_attention_applies(handles_->compute_major, handles_->compute_minor);
  handles_->matmul_workspace = allocate(cuda::LtMatmul::kWorkspaceBytes);
  handles_->matmul = std::make_unique<cuda::LtMatmul>(handles_->matmul_workspace->data(),
                                                      cuda::LtMatmul::kWorkspaceBytes, options.matmul_autotune);
  handles_->sum_scratch = allocate((cuda::kSumBlocks + 1) * sizeof(double));
  if (options.cudnn_attention) handles_->cudnn_attention = std::make_unique<cuda::CudnnAttention>();
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
  // cuDNN's engine workspace is not known before its plan: its first call grows the workspace by it.
  const AttentionPath path = attention_path(handles_->fused_attention, handles_->cudnn_attention != nullptr,
                                            handles_->compute_major, needs.dtype,
                                            needs.batch, needs.heads, needs.head_size, {});
  const int64_t positions = needs.batch * needs.seq;
  // With fp8 products the attention backward casts dqkv for c_attn's (ops.h).
  const bool fp8 = needs.fp8_cast_bytes > 0;
  const AttentionFp8Gradient fp8_gradient{fp8 ? 3 * needs.heads * needs.head_size : 0,
                                          fp8 && path != AttentionPath::Tiled};
  const int64_t query_sum_columns =
      path == AttentionPath::Cudnn ? needs.heads * needs.head_size
                                   : attention_query_sum_columns(path == AttentionPath::Tiled,
                                                                 handles_->deterministic_attention,
                                                                 needs.heads * needs.head_size);
  return std::max({cuda::embedding_backward_workspace_bytes(positions),
                   attention_workspace_bytes(needs.batch, needs.heads, needs.seq, needs.dtype,
                                             path != AttentionPath::Materialized, fp8_gradient, query_sum_columns),
                   cuda::column_sums_workspace_bytes(positions, needs.widest_row),
                   layernorm_backward_scratch_bytes(positions, needs.widest_layernorm, fp8),
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
  std::string notes_on_timing;
  const auto& calls = handles_->attention_forward_calls;
  if (counts.timed > 0)
    notes_on_timing = fmt::format("; algorithms timed for {} shapes, {} of them faster on another than the heuristic's "
                                  "first (up to {:.2f}x)",
                                  counts.timed, counts.changed, counts.best_speedup);
  std::string notes = fmt::format(
      "{}{}; attention forward calls: {} fused on tensor cores ({} on wgmma), {} fused general, {} materialised; "
      "backward calls on tensor cores: {}, {} of them adding dQ atomically",
      products, notes_on_timing, calls[0], handles_->warpgroup_forward_calls, calls[1], calls[2],
      handles_->tiled_backward_calls, handles_->atomic_backward_calls);
  if (handles_->cudnn_attention)
    notes += fmt::format("; attention forward calls on cuDNN {}: {}", handles_->cudnn_attention->version(), calls[3]);
  if (counts.fp8 > 0)
    notes += fmt::format("; fp8 product shapes: {}, {} of them with fast accumulation", counts.fp8,
                         counts.fast_accumulation);
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

void CudaBackend::set_launch_timing(bool on) { cuda::set_launch_timing(on); }
std::vector<LaunchTime> CudaBackend::take_launch_times() { return cuda::take_launch_times(); }

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

// The plain kernel, or with `fp8` the one that also casts din for the next product (ops.h).
void CudaBackend::layernorm_backward(const LayerNormBackward& a) {
  const auto [M, C] = checks::layernorm_backward(a, kCuda);
  const bool write_din = a.din_store == GradStore::Write, write_params = a.param_store == GradStore::Write;
  const int kind = element_kind(a.in.dtype);
  void* scratch = workspace(layernorm_backward_scratch_bytes(M, C, a.fp8 != nullptr));
  if (a.fp8)
    check_cuda(cuda::layernorm_backward_fp8(a.din.data, a.dweight.as<float>(), a.dbias.as<float>(),
                                            a.product_dbias.as<float>(), a.dout.data, a.in.data, a.weight.data, kind,
                                            a.mean.as<float>(), a.rstd.as<float>(), M, C, write_din, write_params,
                                            a.fp8->dout.scale.as<float>(), a.fp8->dout.amax.as<float>(),
                                            a.fp8->grad_dtype == DType::F8E4M3, a.din_fp8.as<uint8_t>(),
                                            a.din_fp8_t.as<uint8_t>(), scratch),
               "layernorm_backward fp8");
  else
    check_cuda(cuda::layernorm_backward(a.din.data, a.dweight.as<float>(), a.dbias.as<float>(), a.dout.data,
                                        a.in.data, a.weight.data, kind, a.mean.as<float>(), a.rstd.as<float>(), M, C,
                                        write_din, write_params, scratch),
               "layernorm_backward");
}

void CudaBackend::gelu_forward(const GeluForward& a) {
  const int64_t count = checks::gelu_forward(a, kCuda);
  if (a.fp8) {  // only cast (ops.h)
    const int64_t N = a.in.shape[a.in.shape.rank - 1];
    check_cuda(cuda::cast_gelu_fp8(a.in.data, element_kind(a.in.dtype), count / N, N, a.fp8->scale.as<float>(),
                                   a.fp8->amax.as<float>(), a.out.as<uint8_t>(), a.out_fp8_t.as<uint8_t>()),
               "gelu_forward (cast to fp8)");
    return;
  }
  check_cuda(cuda::gelu_forward(a.out.data, a.in.data, element_kind(a.in.dtype), count), "gelu_forward");
}

void CudaBackend::dropout(const Dropout& a) {
  const int64_t count = checks::dropout(a, kCuda);
  check_cuda(cuda::dropout(a.out.data, a.in.data, a.residual.data, element_kind(a.in.dtype), count,
                           dropout_threshold(a.probability), 1.0f / (1.0f - a.probability), a.seed, a.stream),
             "dropout");
}

void CudaBackend::gelu_backward(const GeluBackward& a) {
  const int64_t count = checks::gelu_backward(a, kCuda);
  check_cuda(cuda::gelu_backward(a.din.data, a.in.data, a.dout.data, element_kind(a.in.dtype), count),
             "gelu_backward");
}

void CudaBackend::tanh_forward(const TanhForward& a) {
  const int64_t count = checks::tanh_forward(a, kCuda);
  check_cuda(cuda::tanh_forward(a.out.data, a.in.data, element_kind(a.in.dtype), count), "tanh_forward");
}

void CudaBackend::tanh_backward(const TanhBackward& a) {
  const int64_t count = checks::tanh_backward(a, kCuda);
  check_cuda(cuda::tanh_backward(a.din.data, a.out.data, a.dout.data, element_kind(a.out.dtype), count),
             "tanh_backward");
}

void CudaBackend::gather_rows(const GatherRows& a) {
  const auto [B, T, C] = checks::gather_rows(a, kCuda);
  check_cuda(cuda::gather_rows(a.out.data, a.in.data, element_kind(a.in.dtype), B, T, C, a.position), "gather_rows");
}

void CudaBackend::gather_rows_backward(const GatherRowsBackward& a) {
  const auto [B, T, C] = checks::gather_rows_backward(a, kCuda);
  check_cuda(cuda::gather_rows_backward(a.din.data, a.dout.data, element_kind(a.din.dtype), B, T, C, a.position,
                                        a.store == GradStore::Write),
             "gather_rows_backward");
}

void CudaBackend::mask_rows(const MaskRows& a) {
  const auto [M, C] = checks::mask_rows(a, kCuda);
  check_cuda(cuda::mask_rows(a.out.data, a.in.data, a.keep.as<int32_t>(), element_kind(a.in.dtype), M, C),
             "mask_rows");
}

// With fp8 the gradient's codes come from the cross-entropy kernel, their transpose from a second
// kernel reading them (ops.h).
void CudaBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  const auto [M, Vp] = checks::softmax_cross_entropy(a, kCuda);
  const int kind = element_kind(a.logits.dtype);
  if (!a.fp8) {
    check_cuda(cuda::softmax_cross_entropy(a.logits.data, kind, a.losses.as<float>(), a.targets.as<int32_t>(), M,
                                           a.vocab_size, Vp, a.ignore_index, a.loss_scale, a.write_grad),
               "softmax_cross_entropy");
    return;
  }
  const Fp8Operand& cast = a.fp8->dout;
  check_cuda(cuda::softmax_cross_entropy_fp8(a.logits.data, kind, a.losses.as<float>(), a.targets.as<int32_t>(), M,
                                             a.vocab_size, Vp, a.ignore_index, a.loss_scale, cast.scale.as<float>(),
                                             cast.amax.as<float>(), a.fp8->grad_dtype == DType::F8E4M3,
                                             a.grad_fp8.as<uint8_t>()),
             "softmax_cross_entropy");
  check_cuda(cuda::transpose_fp8(a.grad_fp8.as<uint8_t>(), M, Vp, a.grad_fp8_t.as<uint8_t>()),
             "softmax_cross_entropy (transpose)");
}

void CudaBackend::adamw_step(const AdamwStep& a) {
  checks::adamw_step(a, kCuda);
  const auto step = static_cast<float>(a.step);
  const cuda::AdamwScalars scalars{a.lr, a.beta1, a.beta2, a.eps, a.grad_scale,
                                   1.0f / (1.0f - std::pow(a.beta1, step)), 1.0f / (1.0f - std::pow(a.beta2, step))};
  std::vector<cuda::AdamwRange> ranges;
  ranges.reserve(a.segments.size());
  for (const AdamwSegment& segment : a.segments)
    ranges.push_back({segment.offset, segment.count, segment.weight_decay});
  check_cuda(cuda::adamw(a.master.as<float>(), a.param_out.data, element_kind(a.param_out.dtype), a.grad.as<float>(),
                         a.exp_avg.as<float>(), a.exp_avg_sq.as<float>(), ranges.data(),
                         static_cast<int64_t>(ranges.size()), scalars),
             "adamw_step");
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
  if (a.fp8) {  // to fp8 codes (ops.h), one pass for both layouts
    check_cuda(cuda::cast_fp8(a.in.data, element_kind(a.in.dtype), a.in.shape[0], a.in.shape[1],
                              a.fp8->scale.as<float>(), a.fp8->amax.as<float>(), /*e4m3=*/true, a.out.as<uint8_t>(),
                              a.out_t.as<uint8_t>()),
               "convert (fp8)");
    return;
  }
  check_cuda(cuda::convert(a.out.data, element_kind(a.out.dtype), a.in.data, element_kind(a.in.dtype), count),
             "convert");
}

}  // namespace kiln
