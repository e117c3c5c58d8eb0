#include "kiln/backend/op_timing.h"

#include <fmt/format.h>

#include <algorithm>

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

}  // namespace

OpTimingBackend::OpTimingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

template <typename Call>
auto OpTimingBackend::timed(const std::string& op, Call call) {
  const auto start = std::chrono::steady_clock::now();
  const auto finish = [&] {
    inner_->synchronize();
    OpTime& entry = times_[op];
    entry.op = op;
    ++entry.calls;
    entry.total_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
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
  std::string table = fmt::format("{:<52} {:>7} {:>11} {:>11} {:>7}\n", "op (each followed by a device wait)", "calls",
                                  "total ms", "ms/call", "share");
  for (const OpTime& time : times)
    table += fmt::format("{:<52} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}%\n", time.op, time.calls, time.total_ms,
                         time.total_ms / static_cast<double>(time.calls), total > 0 ? 100.0 * time.total_ms / total : 0.0);
  table += fmt::format("{:<52} {:>7} {:>11.3f}\n", "all ops", "", total);
  return table;
}

void OpTimingBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  timed("copy_to_device", [&] { inner_->copy_to_device(device_dst, host_src, bytes); });
}
void OpTimingBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  timed("copy_to_host", [&] { inner_->copy_to_host(host_dst, device_src, bytes); });
}

void OpTimingBackend::embedding_forward(const EmbeddingForward& a) {
  timed("embedding_forward", [&] { inner_->embedding_forward(a); });
}
void OpTimingBackend::embedding_backward(const EmbeddingBackward& a) {
  timed("embedding_backward", [&] { inner_->embedding_backward(a); });
}
void OpTimingBackend::layernorm_forward(const LayerNormForward& a) {
  timed("layernorm_forward", [&] { inner_->layernorm_forward(a); });
}
void OpTimingBackend::residual_layernorm_forward(const ResidualLayerNormForward& a) {
  timed("residual_layernorm_forward", [&] { inner_->residual_layernorm_forward(a); });
}
void OpTimingBackend::layernorm_backward(const LayerNormBackward& a) {
  timed("layernorm_backward", [&] { inner_->layernorm_backward(a); });
}
void OpTimingBackend::matmul_forward(const MatmulForward& a) {
  const std::string op = "matmul_forward " + product_shape(a.in, last_dim(a.out)) + (a.bias.empty() ? "" : " +bias") +
                         (a.gelu_out.empty() ? "" : " +gelu");
  timed(op, [&] { inner_->matmul_forward(a); });
}
void OpTimingBackend::matmul_backward(const MatmulBackward& a) {
  const std::string op = "matmul_backward " + product_shape(a.in, last_dim(a.dout)) +
                         (a.dbias.empty() ? "" : " +dbias") + (a.gelu_in.empty() ? "" : " +dgelu");
  timed(op, [&] { inner_->matmul_backward(a); });
}
void OpTimingBackend::gelu_forward(const GeluForward& a) {
  timed("gelu_forward", [&] { inner_->gelu_forward(a); });
}
void OpTimingBackend::gelu_backward(const GeluBackward& a) {
  timed("gelu_backward", [&] { inner_->gelu_backward(a); });
}
void OpTimingBackend::attention_forward(const AttentionForward& a) {
  timed("attention_forward " + attention_shape(a.qkv, a.num_heads), [&] { inner_->attention_forward(a); });
}
void OpTimingBackend::attention_backward(const AttentionBackward& a) {
  timed("attention_backward " + attention_shape(a.qkv, a.num_heads), [&] { inner_->attention_backward(a); });
}
void OpTimingBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  timed("softmax_cross_entropy", [&] { inner_->softmax_cross_entropy(a); });
}
void OpTimingBackend::residual_forward(const ResidualForward& a) {
  timed("residual_forward", [&] { inner_->residual_forward(a); });
}
void OpTimingBackend::adamw_step(const AdamwStep& a) {
  timed("adamw_step", [&] { inner_->adamw_step(a); });
}
double OpTimingBackend::sum_of_squares(const SumOfSquares& a) {
  return timed("sum_of_squares", [&] { return inner_->sum_of_squares(a); });
}
void OpTimingBackend::fill(const Fill& a) {
  timed("fill", [&] { inner_->fill(a); });
}
void OpTimingBackend::convert(const Convert& a) {
  timed("convert", [&] { inner_->convert(a); });
}

}  // namespace kiln
