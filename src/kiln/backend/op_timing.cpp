#include "kiln/backend/op_timing.h"

#include <fmt/format.h>

#include <chrono>

namespace kiln {

OpTimingBackend::OpTimingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
  inner_->set_launch_timing(true);
}

OpTimingBackend::~OpTimingBackend() { inner_->set_launch_timing(false); }

template <typename Call>
auto OpTimingBackend::timed(const OpWork& work, Call call) {
  const auto start = std::chrono::steady_clock::now();
  const auto finish = [&] {
    inner_->synchronize();
    ledger_.add(work,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count(),
                inner_->take_launch_times());
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

std::string OpTimingBackend::format(const std::vector<OpTotals>& times,
                                    const DeviceLimits* limits) {
  double total = 0.0;
  for (const OpTotals& time : times) total += time.total_ms;
  std::string table = fmt::format(
      "{:<52} {:>7} {:>11} {:>11} {:>7} {:>16}{}\n", "op (each followed by a device wait)", "calls",
      "total ms", "ms/call", "share", "rate", limits ? fmt::format(" {:>12}", "of roofline") : "");
  for (const OpTotals& time : times) {
    const double seconds = time.total_ms * 1e-3;
    const std::string rate =
        seconds <= 0.0     ? ""
        : time.flops > 0.0 ? fmt::format("{:.2f} TFLOP/s", time.flops / seconds * 1e-12)
        : time.bytes > 0.0 ? fmt::format("{:.1f} GB/s", time.bytes / seconds * 1e-9)
                           : "";
    const bool has_roofline = limits && seconds > 0.0 && !time.host_copy;
    const std::string roofline =
        has_roofline
            ? fmt::format(" {:>11.1f}%", 100.0 * roofline_ms(time, *limits) / time.total_ms)
            : "";
    table += fmt::format("{:<52} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}% {:>16}{}\n", time.op,
                         time.calls, time.total_ms, time.total_ms / static_cast<double>(time.calls),
                         total > 0 ? 100.0 * time.total_ms / total : 0.0, rate, roofline);
    // The device work inside the op: per op call, and its share of the op's (wall) time.
    for (const LaunchTotals& launch : time.launches)
      table += fmt::format("  {:<50} {:>7} {:>11.3f} {:>11.4f} {:>6.1f}% of the op\n", launch.what,
                           launch.launches, launch.total_ms,
                           launch.total_ms / static_cast<double>(time.calls),
                           time.total_ms > 0 ? 100.0 * launch.total_ms / time.total_ms : 0.0);
  }
  table += fmt::format("{:<52} {:>7} {:>11.3f}\n", "all ops", "", total);
  return table;
}

void OpTimingBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  timed({.op = "copy_to_device", .bytes = static_cast<double>(bytes), .host_copy = true},
        [&] { inner_->copy_to_device(device_dst, host_src, bytes); });
}
void OpTimingBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  timed({.op = "copy_to_host", .bytes = static_cast<double>(bytes), .host_copy = true},
        [&] { inner_->copy_to_host(host_dst, device_src, bytes); });
}

void OpTimingBackend::embedding_forward(const EmbeddingForward& a) {
  timed(work_of(a), [&] { inner_->embedding_forward(a); });
}
void OpTimingBackend::embedding_backward(const EmbeddingBackward& a) {
  timed(work_of(a), [&] { inner_->embedding_backward(a); });
}
void OpTimingBackend::layernorm_forward(const LayerNormForward& a) {
  timed(work_of(a), [&] { inner_->layernorm_forward(a); });
}
void OpTimingBackend::layernorm_backward(const LayerNormBackward& a) {
  timed(work_of(a), [&] { inner_->layernorm_backward(a); });
}
void OpTimingBackend::matmul_forward(const MatmulForward& a) {
  timed(work_of(a), [&] { inner_->matmul_forward(a); });
}
void OpTimingBackend::matmul_backward(const MatmulBackward& a) {
  timed(work_of(a), [&] { inner_->matmul_backward(a); });
}
void OpTimingBackend::gelu_forward(const GeluForward& a) {
  timed(work_of(a), [&] { inner_->gelu_forward(a); });
}
void OpTimingBackend::gelu_backward(const GeluBackward& a) {
  timed(work_of(a), [&] { inner_->gelu_backward(a); });
}
void OpTimingBackend::attention_forward(const AttentionForward& a) {
  timed(work_of(a), [&] { inner_->attention_forward(a); });
}
void OpTimingBackend::attention_backward(const AttentionBackward& a) {
  timed(work_of(a), [&] { inner_->attention_backward(a); });
}
void OpTimingBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  timed(work_of(a), [&] { inner_->softmax_cross_entropy(a); });
}
void OpTimingBackend::adamw_step(const AdamwStep& a) {
  timed(work_of(a), [&] { inner_->adamw_step(a); });
}
void OpTimingBackend::fp8_update_scales(const Fp8UpdateScales& a) {
  timed(work_of(a), [&] { inner_->fp8_update_scales(a); });
}
void OpTimingBackend::fill(const Fill& a) {
  timed(work_of(a), [&] { inner_->fill(a); });
}
void OpTimingBackend::convert(const Convert& a) {
  timed(work_of(a), [&] { inner_->convert(a); });
}
double OpTimingBackend::sum_of_squares(const SumOfSquares& a) {
  return timed(work_of(a), [&] { return inner_->sum_of_squares(a); });
}

}  // namespace kiln
