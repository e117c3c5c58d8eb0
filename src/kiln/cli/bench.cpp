// `kiln bench train` and `kiln bench gemm` (`kiln bench loader` is bench_loader.cpp): measured numbers, a table for people and --json for
// machines (nccl-tests style: warm-up first, then timed iterations, medians reported).
//
// bench train runs the real Trainer on random tokens (Megatron's --mock-data) and reports the
// median iteration time, tokens/s, model TFLOP/s with PERF.md's 6N + 12 L C T FLOPs per token,
// MFU against the datasheet peak and against the GEMM ceiling measured in the same run, the peak
// of device memory held in kiln's buffers, and the device memory in use as the driver reports it.
// On a GPU of the datasheet table it also gives the iteration's roofline (perf/roofline.h: the
// least time that GPU could take for the same ops) and the measured step's share of it; with
// --profile-ops, each op's share of its own. Its losses must be those of the model on random
// tokens (check_random_token_losses): a run that is fast but wrong prints its row and exits with an
// error. Any model of train/model_kinds.h: a classifier's FLOPs are its architecture's count.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/config_flags.h"
#include "kiln/core/error.h"
#include "kiln/perf/gpu_specs.h"
#include "kiln/perf/roofline.h"
#include "kiln/train/model_kinds.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {
namespace {

constexpr int64_t kCeilingSize = 8192;

struct BenchTrainOptions {
  int64_t warmup_iters = 3;
  int64_t timed_iters = 10;
  bool json = false;
  bool skip_ceiling = false;
  std::string gpu;  // datasheet key; empty: the one whose name the device's matches
};

// Iteration times and losses; with --profile-ops, the op timer restarts when the warm-up ends.
class IterationTimes : public TrainObserver {
 public:
  IterationTimes(OpTimingBackend* op_timing, int64_t warmup_iters) : op_timing_(op_timing), warmup_(warmup_iters) {}
  void on_iteration(const IterationStats& stats) override {
    ms.push_back(stats.elapsed_ms);
    losses.push_back(stats.lm_loss);
    if (op_timing_ && static_cast<int64_t>(ms.size()) == warmup_) op_timing_->reset_times();
  }
  std::vector<double> ms;
  std::vector<double> losses;

 private:
  OpTimingBackend* op_timing_;
  int64_t warmup_;
};

// The losses a run on uniformly random tokens can give. No model predicts a uniformly drawn next
// token better than ln V in expectation, and GPT-2's initialisation (logits of standard deviation
// about 0.02 sqrt(C)) starts a few tenths above it, where a few steps leave it. Losses outside
// [ln V - 0.25, ln V + 1.5] (the margin below covers the mean's sampling noise on a few dozen
// positions), or not finite, come from something other than the model: a step that leaks future
// tokens into the past (below), or overflows or computes garbage (above): fast but wrong.
struct LossCheck {
  double low = 0, high = 0;
  std::string problem;  // empty: plausible
};

// What the model predicts: GPT the next of `vocab_size` tokens; a classifier one of `num_labels`
// labels, which its mock data derives from the tokens, so learning may bring its loss to 0.
LossCheck check_random_token_losses(const std::vector<double>& losses, const Config& config) {
  const bool next_tokens = model_kind(config.model).input == ModelInput::NextTokens;
  const int64_t classes = next_tokens ? config.vocab_size : config.num_labels;
  LossCheck check;
  const double floor = std::log(static_cast<double>(classes));
  check.low = next_tokens ? floor - 0.25 : 0.0;
  check.high = floor + 1.5;
  const std::string range = fmt::format("{}ln {} +1.5", next_tokens ? "ln V -0.25 to " : "0 to ", classes);
  for (size_t i = 0; i < losses.size() && check.problem.empty(); ++i)
    if (!std::isfinite(losses[i]) || losses[i] < check.low || losses[i] > check.high)
      check.problem = fmt::format("iteration {}'s loss {:.4f} is outside [{:.4f}, {:.4f}], {}", i + 1, losses[i],
                                  check.low, check.high, range);
  return check;
}

// After the row is printed (its speed is worth seeing, not worth trusting): an error naming the
// iteration whose loss is implausible, and a non-zero exit.
void require_plausible(const LossCheck& check, double tokens_per_second) {
  KILN_CHECK(check.problem.empty(),
             "the measured run's losses are not those of the model on uniformly random tokens: {}; its {:.0f} tokens/s "
             "measure a wrong computation",
             check.problem, tokens_per_second);
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

DType gemm_dtype(const std::string& precision) {
  return precision == "bf16"  ? DType::BF16
         : precision == "fp16" ? DType::F16
         : precision == "fp8"  ? DType::F8E4M3
                               : DType::F32;
}

double gemm_tflops(double ms, int64_t M, int64_t N, int64_t K) {
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / (ms * 1e-3) / 1e12;
}

void bench_train(const ConfigFlags& flags, const BenchTrainOptions& options) {
  KILN_CHECK(options.warmup_iters >= 0 && options.timed_iters > 0,
             "--warmup-iters must be >= 0 and --timed-iters positive");
  const std::optional<GpuSpec> chosen_spec = find_gpu_by_key(options.gpu);
  KILN_CHECK(options.gpu.empty() || chosen_spec,
             "--gpu '{}' is not a datasheet kiln knows (kiln estimate --help lists them)", options.gpu);
  Config config = flags.build();
  config.mock_data = true;
  if (config.vocab_size == 0) config.vocab_size = 50257;
  config.disable_validation();
  config.save.clear();
  config.save_interval = 0;
  config.load.clear();
  config.train_iters = options.warmup_iters + options.timed_iters;
  Trainer trainer(config);
  IterationTimes times(trainer.op_timing(), options.warmup_iters);
  trainer.add_observer(&times);
  trainer.run();
  const Config& resolved = trainer.config();
  const std::vector<double> timed(times.ms.begin() + options.warmup_iters, times.ms.end());
  const double ms = median(timed);
  const LossCheck losses = check_random_token_losses(times.losses, resolved);
  const double tokens_per_iteration = static_cast<double>(resolved.global_batch_size * resolved.seq_length);
  const double tokens_per_second = tokens_per_iteration / (ms * 1e-3);
  const double samples_per_second = static_cast<double>(resolved.global_batch_size) / (ms * 1e-3);
  // GPT: PERF.md's 6N + 12 L C T a token, the peers' formula; another model: its architecture's.
  const double flops_per_iteration =
      model_kind(resolved.model).input == ModelInput::NextTokens
          ? (6.0 * static_cast<double>(trainer.model().num_parameters()) +
             12.0 * static_cast<double>(resolved.num_layers * resolved.hidden_size * resolved.seq_length)) *
                tokens_per_iteration
          : trainer.architecture().flops_per_iteration(resolved.global_batch_size, resolved.seq_length, false);
  const double model_tflops = flops_per_iteration / (ms * 1e-3) / 1e12;
  Backend& backend = trainer.backend();
  const std::string device = backend.description();
  const std::string precision = resolved.precision_name();
  const auto spec = options.gpu.empty() ? find_gpu_by_device_name(device) : chosen_spec;
  const double datasheet = spec ? spec->peak_tflops(precision) : 0.0;
  const std::optional<DeviceLimits> limits = datasheet_limits_if_any(spec, precision);
  const double iteration_roofline_ms =
      limits ? roofline(count_iteration_ops(iteration_shape(resolved)), *limits).ms : 0.0;
  const double peak_gib = static_cast<double>(backend.peak_allocated_bytes()) / 1073741824.0;
  // What the driver reports in use after the run and before the
  // ceiling measurement allocates its matrices: kiln's buffers plus the CUDA context and the
  // libraries' own workspaces (nothing is freed between steps, so this is the peak).
  const auto memory = backend.device_memory();
  const double device_used_gib = memory ? static_cast<double>(memory->total - memory->free) / 1073741824.0 : 0.0;
  double ceiling = 0.0;
  if (!options.skip_ceiling && backend.device() == Device::CUDA)
    ceiling = gemm_tflops(backend.time_gemm_ms(gemm_dtype(precision), precision == "tf32", kCeilingSize, kCeilingSize,
                                               kCeilingSize, 10),
                          kCeilingSize, kCeilingSize, kCeilingSize);

  if (options.json) {
    nlohmann::json out = {
        {"device", device}, {"model_kind", resolved.model}, {"precision", precision}, {"num_layers", resolved.num_layers},
        {"hidden_size", resolved.hidden_size}, {"num_attention_heads", resolved.num_attention_heads},
        {"seq_length", resolved.seq_length}, {"micro_batch_size", resolved.micro_batch_size},
        {"global_batch_size", resolved.global_batch_size}, {"parameters", trainer.model().num_parameters()},
        {"timed_iters", options.timed_iters}, {"median_ms_per_iteration", ms},
        {"tokens_per_second", tokens_per_second}, {"samples_per_second", samples_per_second},
        {"model_tflops", model_tflops},
        {"datasheet_peak_tflops", datasheet}, {"mfu_datasheet", datasheet > 0 ? model_tflops / datasheet : 0.0},
        {"gemm_ceiling_tflops", ceiling}, {"mfu_gemm_ceiling", ceiling > 0 ? model_tflops / ceiling : 0.0},
        {"peak_memory_gib", peak_gib}, {"device_used_gib", device_used_gib},
        {"roofline_ms_per_iteration", iteration_roofline_ms},
        {"share_of_roofline", iteration_roofline_ms > 0 ? iteration_roofline_ms / ms : 0.0},
        {"fused_attention", resolved.fused_attention}, {"matmul_epilogues", resolved.matmul_epilogues},
        {"warpgroup_attention", resolved.warpgroup_attention},
        {"deterministic_attention", resolved.deterministic_attention},
        {"matmul_autotune", resolved.matmul_autotune}, {"cudnn_attention", resolved.cudnn_attention},
        {"cuda_graph", resolved.cuda_graph}, {"fp8_format", resolved.fp8_format},
        {"fp8_fast_accumulation", resolved.fp8_fast_accumulation}, {"fp8_classifier", resolved.fp8_classifier},
        {"loss_chunk_rows", resolved.loss_chunk_rows},
        {"backend_notes", backend.run_notes()},
        {"recompute", resolved.recompute_policy().describe()}, {"losses", times.losses},
        {"loss_plausible", losses.problem.empty()}};
    if (const OpTimingBackend* timing = trainer.op_timing()) {
      out["op_times"] = nlohmann::json::array();
      for (const OpTotals& time : timing->times()) {
        const bool bounded = limits && !time.host_copy;
        nlohmann::json launches = nlohmann::json::array();
        for (const LaunchTotals& launch : time.launches)
          launches.push_back({{"what", launch.what}, {"launches", launch.launches}, {"total_ms", launch.total_ms}});
        out["op_times"].push_back({{"op", time.op}, {"calls", time.calls}, {"total_ms", time.total_ms},
                                   {"roofline_ms", bounded ? roofline_ms(time, *limits) : 0.0},
                                   {"launches", launches}});
      }
    }
    fmt::print("{}\n", out.dump());
    require_plausible(losses, tokens_per_second);
    return;
  }
  fmt::print("# kiln bench train | {} | {} | {} {} layers x {} hidden, {} heads, seq {}, micro-batch {}, global {} "
             "| {} parameters | median of {} iterations after {} warm-up\n",
             device, precision, resolved.model, resolved.num_layers, resolved.hidden_size, resolved.num_attention_heads,
             resolved.seq_length, resolved.micro_batch_size, resolved.global_batch_size,
             trainer.model().num_parameters(), options.timed_iters, options.warmup_iters);
  fmt::print("#{:>14} {:>14} {:>14} {:>16} {:>18} {:>16} {:>16}\n", "ms/iter", "tokens/s", "model TFLOP/s",
             "MFU datasheet", "MFU GEMM ceiling", "kiln peak GiB", "device used GiB");
  const std::string mfu_sheet = datasheet > 0 ? fmt::format("{:.1f}% of {:.0f}", 100 * model_tflops / datasheet, datasheet) : "n/a";
  const std::string mfu_ceiling = ceiling > 0 ? fmt::format("{:.1f}% of {:.0f}", 100 * model_tflops / ceiling, ceiling) : "n/a";
  fmt::print(" {:>14.2f} {:>14.0f} {:>14.2f} {:>16} {:>18} {:>16.2f} {:>16.2f}\n", ms, tokens_per_second,
             model_tflops, mfu_sheet, mfu_ceiling, peak_gib, device_used_gib);
  if (iteration_roofline_ms > 0)
    fmt::print("# roofline: {:.2f} ms per iteration at the {} datasheet's {:.0f} TFLOP/s and {:.2f} TB/s (the same ops "
               "at their least time each); this run took {:.2f}x that\n",
               iteration_roofline_ms, spec->key, limits->tflops, limits->bandwidth_gb_per_s * 1e-3,
               ms / iteration_roofline_ms);
  if (const std::string notes = backend.run_notes(); !notes.empty()) fmt::print("# {}\n", notes);
  if (const OpTimingBackend* timing = trainer.op_timing())
    fmt::print("# time by op over the {} timed iterations (--profile-ops: a device wait after every op, so the "
               "iterations above are slower than unprofiled; indented under an op, the device work inside it as "
               "timed on the device)\n{}",
               options.timed_iters, OpTimingBackend::format(timing->times(), limits ? &*limits : nullptr));
  fmt::print("# losses: first {:.4f}, last {:.4f} (random tokens: between {:.4f} and {:.4f} if the step is right)\n",
             times.losses.front(), times.losses.back(), losses.low, losses.high);
  require_plausible(losses, tokens_per_second);
}

struct BenchGemmOptions {
  std::string device = "cuda";
  std::vector<std::string> precisions;
  int64_t m = kCeilingSize, n = kCeilingSize, k = kCeilingSize;
  int iterations = 20;
  bool json = false;
  bool autotune = false;
};

void bench_gemm(const BenchGemmOptions& options) {
  KILN_CHECK(!options.autotune || options.device == "cuda",
             "--matmul-autotune needs --device cuda (it chooses among cuBLASLt's algorithms)");
  std::vector<std::string> precisions = options.precisions;
  auto backend = make_backend(options.device, BackendOptions{.matmul_autotune = options.autotune});
  const std::string device = backend->description();
  const auto spec = find_gpu_by_device_name(device);
  if (precisions.empty()) {
    precisions = options.device == "cpu" ? std::vector<std::string>{"fp32"}
                                         : std::vector<std::string>{"fp32", "tf32", "bf16", "fp16"};
    if (spec && spec->fp8_tflops > 0) precisions.push_back("fp8");  // the datasheet lists fp8 tensor cores
  }
  if (!options.json) {
    fmt::print("# kiln bench gemm | {} | C[M,N] = A[M,K] B[K,N], random inputs, median of {} after 1 warm-up "
               "(fp8: E4M3 inputs, B stored [N,K], bf16 C); cuBLASLt algorithm: {}\n",
               device, options.iterations,
               options.autotune ? "the fastest of the heuristic's first 8, timed in the warm-up" : "the heuristic's first");
    fmt::print("#{:>7} {:>7} {:>7} {:>7} {:>10} {:>10} {:>12}\n", "dtype", "M", "N", "K", "ms", "TFLOP/s",
               "of datasheet");
  }
  for (const std::string& precision : precisions) {
    KILN_CHECK(precision == "fp32" || precision == "tf32" || precision == "bf16" || precision == "fp16" ||
                   precision == "fp8",
               "--dtype '{}' is not one of fp32, tf32, bf16, fp16, fp8", precision);
    const double ms = backend->time_gemm_ms(gemm_dtype(precision), precision == "tf32", options.m, options.n,
                                            options.k, options.iterations);
    const double tflops = gemm_tflops(ms, options.m, options.n, options.k);
    const double datasheet = spec ? spec->peak_tflops(precision) : 0.0;
    if (options.json) {
      fmt::print("{}\n", nlohmann::json{{"device", device}, {"dtype", precision}, {"m", options.m}, {"n", options.n},
                                        {"k", options.k}, {"median_ms", ms}, {"tflops", tflops},
                                        {"datasheet_peak_tflops", datasheet}, {"matmul_autotune", options.autotune}}
                             .dump());
    } else {
      const std::string share = datasheet > 0 ? fmt::format("{:.1f}%", 100 * tflops / datasheet) : "n/a";
      fmt::print(" {:>7} {:>7} {:>7} {:>7} {:>10.3f} {:>10.1f} {:>12}\n", precision, options.m, options.n, options.k,
                 ms, tflops, share);
    }
  }
  if (const std::string notes = backend->run_notes(); !options.json && options.autotune && !notes.empty())
    fmt::print("# {}\n", notes);
}

}  // namespace

void add_bench_command(CLI::App& root) {
  CLI::App* bench = root.add_subcommand("bench", "measure training speed and GEMM throughput");
  bench->require_subcommand(1);

  auto flags = std::make_shared<ConfigFlags>();
  auto train_options = std::make_shared<BenchTrainOptions>();
  CLI::App* train = bench->add_subcommand("train", "time training steps of a GPT on random tokens");
  train->add_option("--warmup-iters", train_options->warmup_iters, "iterations run before timing");
  train->add_option("--timed-iters", train_options->timed_iters, "iterations timed (median reported)");
  train->add_flag("--json", train_options->json, "one JSON object instead of the table");
  train->add_flag("--skip-gemm-ceiling", train_options->skip_ceiling, "do not measure the GEMM ceiling");
  train->add_option("--gpu", train_options->gpu,
                    "datasheet for MFU and the roofline (h100-sxm, h200, ...; default: the device's own, by name)");
  add_config_flags(*train, flags);
  train->callback([flags, train_options] { bench_train(*flags, *train_options); });

  auto gemm_options = std::make_shared<BenchGemmOptions>();
  CLI::App* gemm = bench->add_subcommand("gemm", "measure the GEMM ceiling per precision");
  gemm->add_option("--device", gemm_options->device, "cpu or cuda");
  gemm->add_option("--dtype", gemm_options->precisions,
                   "fp32, tf32, bf16, fp16, fp8 (E4M3; default: all the device has)")
      ->delimiter(',');
  gemm->add_option("--m", gemm_options->m, "rows of A and C");
  gemm->add_option("--n", gemm_options->n, "columns of B and C");
  gemm->add_option("--k", gemm_options->k, "inner dimension");
  gemm->add_option("--iters", gemm_options->iterations, "timed repetitions");
  gemm->add_flag("--json", gemm_options->json, "JSON lines instead of the table");
  gemm->add_flag("--matmul-autotune", gemm_options->autotune,
                 "time the cuBLASLt heuristic's first 8 algorithms in the warm-up and keep the fastest");
  gemm->callback([gemm_options] { bench_gemm(*gemm_options); });

  add_bench_loader_command(*bench);
  add_bench_attention_command(*bench);
  add_bench_comm_command(*bench);
}

}  // namespace kiln::cli
