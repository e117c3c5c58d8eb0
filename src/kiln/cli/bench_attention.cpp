// `kiln bench attention`: the attention core alone (the attention_forward and attention_backward
// ops), forward and backward timed separately on random inputs, in TFLOP/s by the FlashAttention
// papers' count (perf/flops.h). The kernel that decides most of a step's attention time can be
// compared with PyTorch's scaled_dot_product_attention on the same shapes
// (bench/peers/pytorch_attention.py prints the same fields) and between kiln's own paths
// (--no-fused-attention, --warpgroup-attention, --no-deterministic-attention) and cuDNN's
// (--cudnn-attention).
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/core/rng.h"
#include "kiln/perf/flops.h"

namespace kiln::cli {
namespace {

struct BenchAttentionOptions {
  std::string device = "cuda", dtype = "bf16", mask = "causal";
  int64_t batch = 64, seq = 1024, heads = 12, head_size = 64;
  int warmup = 3, iterations = 20;
  bool no_fused_attention = false, warpgroup_attention = false, no_deterministic_attention = false,
       cudnn_attention = false, json = false;
};

// A device tensor of `shape` in `dtype` holding uniform values in [-1, 1) (or zeros).
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buffer;
  Tensor tensor;
};
DeviceTensor random_tensor(Backend& backend, Shape shape, DType dtype, Rng* rng) {
  DeviceTensor result;
  result.tensor.shape = shape;
  result.tensor.dtype = dtype;
  result.tensor.device = backend.device();
  result.buffer = backend.allocate(result.tensor.bytes());
  result.tensor.data = result.buffer->data();
  std::vector<float> values(static_cast<size_t>(shape.numel()), 0.0f);
  if (rng)
    for (float& value : values) value = 2.0f * rng->uniform() - 1.0f;
  std::vector<char> stored(result.tensor.bytes());
  narrow_from_fp32(values.data(), dtype, stored.data(), shape.numel());
  backend.copy_to_device(result.tensor.data, stored.data(), stored.size());
  return result;
}

// Milliseconds per call of `call` over `iterations` calls after `warmup`, the device drained
// before and after.
template <typename Call>
double ms_per_call(Backend& backend, int warmup, int iterations, Call call) {
  for (int i = 0; i < warmup; ++i) call();
  backend.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  backend.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iterations;
}

void bench_attention(const BenchAttentionOptions& o) {
  KILN_CHECK(o.batch > 0 && o.seq > 0 && o.heads > 0 && o.head_size > 0,
             "--batch, --seq-length, --num-attention-heads and --head-size must be positive");
  KILN_CHECK(o.warmup >= 0 && o.iterations > 0, "--warmup must be >= 0 and --iters positive");
  KILN_CHECK(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16", "--dtype '{}' is not fp32, bf16 or fp16",
             o.dtype);
  KILN_CHECK(o.mask == "causal" || o.mask == "padding" || o.mask == "causal_padding",
             "--mask '{}' is not causal, padding or causal_padding", o.mask);
  const DType dtype = o.dtype == "bf16" ? DType::BF16 : o.dtype == "fp16" ? DType::F16 : DType::F32;
  const AttentionMask mask = o.mask == "causal"    ? AttentionMask::Causal
                             : o.mask == "padding" ? AttentionMask::KeyPadding
                                                   : AttentionMask::CausalKeyPadding;
  BackendOptions backend_options;
  backend_options.fused_attention = !o.no_fused_attention;
  backend_options.warpgroup_attention = o.warpgroup_attention;
  backend_options.deterministic_attention = !o.no_deterministic_attention;
  backend_options.cudnn_attention = o.cudnn_attention;
  auto backend = make_backend(o.device, backend_options);
  const int64_t B = o.batch, T = o.seq, NH = o.heads, C = o.heads * o.head_size;
  Backend::WorkspaceNeeds needs;
  needs.batch = B;
  needs.seq = T;
  needs.heads = NH;
  needs.head_size = o.head_size;
  needs.dtype = dtype;
  backend->reserve_workspace(needs);

  Rng rng(1);
  const DeviceTensor qkv = random_tensor(*backend, {B, T, 3 * C}, dtype, &rng);
  const DeviceTensor dout = random_tensor(*backend, {B, T, C}, dtype, &rng);
  const DeviceTensor out = random_tensor(*backend, {B, T, C}, dtype, nullptr);
  const DeviceTensor dqkv = random_tensor(*backend, {B, T, 3 * C}, dtype, nullptr);
  const DeviceTensor lse = random_tensor(*backend, {B * NH * T}, DType::F32, nullptr);
  DeviceTensor key_mask;  // every 8th key padded
  if (mask != AttentionMask::Causal) {
    std::vector<int32_t> keep(static_cast<size_t>(B * T), 1);
    for (size_t i = 0; i < keep.size(); i += 8) keep[i] = 0;
    key_mask.tensor = {nullptr, Shape{B, T}, DType::I32, backend->device()};
    key_mask.buffer = backend->allocate(key_mask.tensor.bytes());
    key_mask.tensor.data = key_mask.buffer->data();
    backend->copy_to_device(key_mask.tensor.data, keep.data(), keep.size() * sizeof(int32_t));
  }
  const AttentionForward forward{out.tensor, lse.tensor, qkv.tensor, key_mask.tensor, static_cast<int>(NH), mask};
  const AttentionBackward backward{dqkv.tensor, dout.tensor, qkv.tensor, out.tensor, lse.tensor, key_mask.tensor,
                                   static_cast<int>(NH), mask};
  const double forward_ms = ms_per_call(*backend, o.warmup, o.iterations, [&] { backend->attention_forward(forward); });
  const double backward_ms =
      ms_per_call(*backend, o.warmup, o.iterations, [&] { backend->attention_backward(backward); });
  const double flops = attention_forward_flops(B, T, C, mask != AttentionMask::KeyPadding);
  const double forward_tflops = flops / (forward_ms * 1e-3) * 1e-12;
  const double backward_tflops = kAttentionBackwardFlopsFactor * flops / (backward_ms * 1e-3) * 1e-12;
  const std::string device = backend->description(), notes = backend->run_notes();

  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"who", "kiln"}, {"device", device}, {"dtype", o.dtype}, {"mask", o.mask},
                                      {"batch", B}, {"seq_length", T}, {"heads", NH}, {"head_size", o.head_size},
                                      {"fused_attention", !o.no_fused_attention},
                                      {"warpgroup_attention", o.warpgroup_attention},
                                      {"deterministic_attention", !o.no_deterministic_attention},
                                      {"cudnn_attention", o.cudnn_attention},
                                      {"forward_ms", forward_ms},
                                      {"backward_ms", backward_ms}, {"forward_tflops", forward_tflops},
                                      {"backward_tflops", backward_tflops}, {"backend_notes", notes}}
                           .dump());
    return;
  }
  fmt::print("# kiln bench attention | {} | {} | batch {} x sequence {}, {} heads of {}, {} mask | mean of {} after {} "
             "warm-up\n",
             device, o.dtype, B, T, NH, o.head_size, o.mask, o.iterations, o.warmup);
  fmt::print("#{:>11} {:>10} {:>10}\n", "pass", "ms", "TFLOP/s");
  fmt::print(" {:>11} {:>10.3f} {:>10.2f}\n", "forward", forward_ms, forward_tflops);
  fmt::print(" {:>11} {:>10.3f} {:>10.2f}\n", "backward", backward_ms, backward_tflops);
  if (!notes.empty()) fmt::print("# {}\n", notes);
}

}  // namespace

void add_bench_attention_command(CLI::App& bench) {
  auto options = std::make_shared<BenchAttentionOptions>();
  CLI::App* command = bench.add_subcommand("attention", "time the attention core, forward and backward");
  command->add_option("--device", options->device, "cpu or cuda");
  command->add_option("--dtype", options->dtype, "fp32, bf16 or fp16");
  command->add_option("--batch", options->batch, "sequences");
  command->add_option("--seq-length", options->seq, "tokens per sequence");
  command->add_option("--num-attention-heads", options->heads, "heads");
  command->add_option("--head-size", options->head_size, "channels per head");
  command->add_option("--mask", options->mask, "causal, padding or causal_padding (every 8th key padded)");
  command->add_option("--warmup", options->warmup, "untimed calls first");
  command->add_option("--iters", options->iterations, "timed calls (mean reported)");
  command->add_flag("--no-fused-attention", options->no_fused_attention, "the materialised cuBLASLt path");
  command->add_flag("--warpgroup-attention", options->warpgroup_attention,
                    "the tensor-core kernels on wgmma where the GPU has it (H100/H200), not mma.sync");
  command->add_flag("--no-deterministic-attention", options->no_deterministic_attention,
                    "the tensor-core backward in one kernel adding dQ in fp32 atomics");
  command->add_flag("--cudnn-attention", options->cudnn_attention,
                    "cuDNN's fused flash-attention engines (cuDNN 9 loaded at run time), where they take the call");
  command->add_flag("--json", options->json, "one JSON object instead of the table");
  command->callback([options] { bench_attention(*options); });
}

}  // namespace kiln::cli
