#include "kiln/backend/op_timing.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/perf/flops.h"

namespace kiln {
namespace {

int64_t last_dim(const Tensor& tensor) { return tensor.shape.rank ? tensor.shape[tensor.shape.rank - 1] : 0; }

// "M x K x N" of a product whose input is [.., K] with M rows and whose output has N columns.
std::string product_shape(const Tensor& in, int64_t N) {
  const int64_t K = last_dim(in), M = K ? in.numel() / K : 0;
  return fmt::format("{}x{}x{}", M, K, N);
}

// "B x T, NH heads of HS" from qkv [B, T, 3C].
std::string attention_shape(const Tensor& qkv, int num_heads) {
  if (qkv.shape.rank != 3 || num_heads <= 0) return qkv.shape.to_string();
  return fmt::format("{}x{}, {} heads of {}", qkv.shape[0], qkv.shape[1], num_heads, qkv.shape[2] / 3 / num_heads);
}

// Bytes of the tensors given, empty ones counting nothing.
double bytes_of(std::initializer_list<const Tensor*> tensors) {
  double total = 0.0;
  for (const Tensor* tensor : tensors)
    if (!tensor->empty()) total += static_cast<double>(tensor->bytes());
  return total;
}

// 2 M K N for a product whose input is [M, K] and output has N columns.
double product_flops(const Tensor& in, int64_t N) { return 2.0 * static_cast<double>(in.numel()) * N; }

// perf/flops.h's count for qkv [B, T, 3C].
double attention_flops(const Tensor& qkv, AttentionMask mask) {
  if (qkv.shape.rank != 3) return 0.0;
  return attention_forward_flops(qkv.shape[0], qkv.shape[1], qkv.shape[2] / 3, mask != AttentionMask::KeyPadding);
}

}  // namespace

OpTimingBackend::OpTimingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

template <typename Call>
auto OpTimingBackend::timed(const std::string& op, Work work, Call call) {
  const auto start = std::chrono::steady_clock::now();
  const auto finish = [&] {
    inner_->synchronize();
    OpTime& entry = times_[op];
    entry.op = op;
    ++entry.calls;
    entry.total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    entry.flops += work.flops;
    entry.bytes += work.bytes;
  };
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    finish();
  } else {
    auto result = call();
    finish();
    return result;
  }
}

std::vector<OpTimingBackend::OpTime> OpTimingBackend::times() const {
  std::vector<OpTime> result;
  for (const auto& [op, time] : times_) result.push_back(time);
  std::stable_sort(result.begin(), result.end(),
                   [](const OpTime& a, const OpTime& b) { return a.total_ms > b.total_ms; });
  return result;
}

std::string OpTimingBackend::format(const std::vector<OpTime>& times) {
  double total = 0.0;
  for (const OpTime& time : times) total += time.total_ms;
  std::string table = fmt::format("{:<52} {:>7} {:>11} {:>11} {:>7} {:>16}\n", "op (each followed by a device wait)",
                                  "calls", "total ms", "ms/call", "share", "rate");
  for (const OpTime& time : times) {
    const double seconds = time.total_ms * 1e-3;
    const std::string rate = seconds <= 0.0      ? ""
                             : time.flops > 0.0 ? fmt::format("{:.2f} TFLOP/s", time.flops / seconds * 1e-12)
                             : time.bytes > 0.0 ? fmt::format("{:.1f} GB/s", time.bytes / seconds * 1e-9)
                                                : "";
    table += fmt::format("{:<52} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}% {:>16}\n", time.op, time.calls, time.total_ms,
                         time.total_ms / static_cast<double>(time.calls), total > 0 ? 100.0 * time.total_ms / total : 0.0,
                         rate);
  }
  table += fmt::format("{:<52} {:>7} {:>11.3f}\n", "all ops", "", total);
  return table;
}

void OpTimingBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  timed("copy_to_device", {0.0, static_cast<double>(bytes)}, [&] { inner_->copy_to_device(device_dst, host_src, bytes); });
}
void OpTimingBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  timed("copy_to_host", {0.0, static_cast<double>(bytes)}, [&] { inner_->copy_to_host(host_dst, device_src, bytes); });
}

// Traffic: out written, the same amount of wte and wpe rows gathered, tokens read.
void OpTimingBackend::embedding_forward(const EmbeddingForward& a) {
  timed("embedding_forward", {0.0, 3 * bytes_of({&a.out}) + bytes_of({&a.tokens})},
        [&] { inner_->embedding_forward(a); });
}
// Traffic: dout and tokens read; per position one wte gradient row (fp32) read and written; dwpe's
// used rows read and written.
void OpTimingBackend::embedding_backward(const EmbeddingBackward& a) {
  const double rows = a.dout.shape.rank == 3 ? static_cast<double>(a.dout.shape[0] * a.dout.shape[1]) : 0.0;
  const double row_bytes = a.dwte.shape.rank == 2 ? static_cast<double>(a.dwte.shape[1]) * sizeof(float) : 0.0;
  const double positions = a.dout.shape.rank == 3 ? static_cast<double>(a.dout.shape[1]) : 0.0;
  timed("embedding_backward", {0.0, bytes_of({&a.dout, &a.tokens}) + 2 * rows * row_bytes + 2 * positions * row_bytes},
        [&] { inner_->embedding_backward(a); });
}
void OpTimingBackend::layernorm_forward(const LayerNormForward& a) {
  timed("layernorm_forward", {0.0, bytes_of({&a.out, &a.mean, &a.rstd, &a.in, &a.weight, &a.bias})},
        [&] { inner_->layernorm_forward(a); });
}
void OpTimingBackend::residual_layernorm_forward(const ResidualLayerNormForward& a) {
  const LayerNormForward& n = a.norm;
  timed("residual_layernorm_forward",
        {0.0, bytes_of({&n.out, &n.mean, &n.rstd, &n.in, &n.weight, &n.bias, &a.residual, &a.residual_out})},
        [&] { inner_->residual_layernorm_forward(a); });
}
// din, dweight and dbias accumulate: read and written.
void OpTimingBackend::layernorm_backward(const LayerNormBackward& a) {
  timed("layernorm_backward",
        {0.0, 2 * bytes_of({&a.din, &a.dweight, &a.dbias}) + bytes_of({&a.dout, &a.in, &a.weight, &a.mean, &a.rstd})},
        [&] { inner_->layernorm_backward(a); });
}
void OpTimingBackend::matmul_forward(const MatmulForward& a) {
  const int64_t N = last_dim(a.out);
  const std::string op = "matmul_forward " + product_shape(a.in, N) + (a.bias.empty() ? "" : " +bias") +
                         (a.gelu_out.empty() ? "" : " +gelu") + (a.fp8 ? " fp8" : "");
  timed(op, {product_flops(a.in, N), bytes_of({&a.out, &a.in, &a.weight, &a.bias, &a.gelu_out})},
        [&] { inner_->matmul_forward(a); });
}
// The weight gradient always (one product), the input gradient when asked for (another); dweight
// and dbias accumulate.
void OpTimingBackend::matmul_backward(const MatmulBackward& a) {
  const int64_t N = last_dim(a.dout);
  const std::string op = "matmul_backward " + product_shape(a.in, N) + (a.dbias.empty() ? "" : " +dbias") +
                         (a.gelu_in.empty() ? "" : " +dgelu") + (a.fp8 ? " fp8" : "");
  const double flops = product_flops(a.in, N) * (a.din.empty() ? 1.0 : 2.0);
  timed(op,
        {flops, 2 * bytes_of({&a.dweight, &a.dbias}) + bytes_of({&a.din, &a.dout, &a.in, &a.weight, &a.gelu_in})},
        [&] { inner_->matmul_backward(a); });
}
void OpTimingBackend::gelu_forward(const GeluForward& a) {
  timed("gelu_forward", {0.0, bytes_of({&a.out, &a.in})}, [&] { inner_->gelu_forward(a); });
}
void OpTimingBackend::gelu_backward(const GeluBackward& a) {
  timed("gelu_backward", {0.0, bytes_of({&a.din, &a.in, &a.dout})}, [&] { inner_->gelu_backward(a); });
}
void OpTimingBackend::attention_forward(const AttentionForward& a) {
  timed("attention_forward " + attention_shape(a.qkv, a.num_heads),
        {attention_flops(a.qkv, a.mask), bytes_of({&a.out, &a.lse, &a.qkv, &a.key_mask})},
        [&] { inner_->attention_forward(a); });
}
void OpTimingBackend::attention_backward(const AttentionBackward& a) {
  timed("attention_backward " + attention_shape(a.qkv, a.num_heads),
        {kAttentionBackwardFlopsFactor * attention_flops(a.qkv, a.mask),
         bytes_of({&a.dqkv, &a.dout, &a.qkv, &a.out, &a.lse, &a.key_mask})},
        [&] { inner_->attention_backward(a); });
}
// The logits read, and written again when the gradient replaces them.
void OpTimingBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  timed("softmax_cross_entropy",
        {0.0, (a.write_grad ? 2.0 : 1.0) * bytes_of({&a.logits}) + bytes_of({&a.losses, &a.targets})},
        [&] { inner_->softmax_cross_entropy(a); });
}
void OpTimingBackend::residual_forward(const ResidualForward& a) {
  timed("residual_forward", {0.0, bytes_of({&a.out, &a.a, &a.b})}, [&] { inner_->residual_forward(a); });
}
// master and both moments read and written, the gradient read, the parameters written.
void OpTimingBackend::adamw_step(const AdamwStep& a) {
  const bool separate = !a.param_out.empty() && a.param_out.data != a.master.data;
  timed("adamw_step",
        {0.0, 2 * bytes_of({&a.master, &a.exp_avg, &a.exp_avg_sq}) + bytes_of({&a.grad}) +
                  (separate ? bytes_of({&a.param_out}) : 0.0)},
        [&] { inner_->adamw_step(a); });
}
double OpTimingBackend::sum_of_squares(const SumOfSquares& a) {
  return timed("sum_of_squares", {0.0, bytes_of({&a.in})}, [&] { return inner_->sum_of_squares(a); });
}
void OpTimingBackend::fp8_update_scales(const Fp8UpdateScales& a) {
  timed("fp8_update_scales", {0.0, 2 * bytes_of({&a.state})}, [&] { inner_->fp8_update_scales(a); });
}
void OpTimingBackend::fill(const Fill& a) {
  timed("fill", {0.0, bytes_of({&a.out})}, [&] { inner_->fill(a); });
}
void OpTimingBackend::convert(const Convert& a) {
  timed("convert", {0.0, bytes_of({&a.out, &a.in})}, [&] { inner_->convert(a); });
}

}  // namespace kiln
