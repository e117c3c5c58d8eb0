// `kiln train`: a YAML config (--config) overridden by Megatron-named flags, then training. On a
// GPU of the datasheet table it states the iteration's roofline first (perf/roofline.h), so the
// log's tokens/s can be read against the most that GPU allows.
// Under `kiln launch`, torchrun or `srun` (dist/bootstrap.h) each process is one data-parallel
// rank: it joins the group before training, and only rank 0 prints and writes files.
#include <fmt/format.h>

#include <memory>

#include "kiln/cli/commands.h"
#include "kiln/cli/config_flags.h"
#include "kiln/core/error.h"
#include "kiln/dist/process_group.h"
#include "kiln/obs/log_line.h"
#include "kiln/obs/prometheus_endpoint.h"
#include "kiln/obs/run_report_prediction.h"
#include "kiln/obs/step_trace.h"
#include "kiln/obs/tensorboard_observer.h"
#include "kiln/perf/gpu_specs.h"
#include "kiln/perf/roofline.h"
#include "kiln/train/preemption.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {
namespace {

// Rank 0's TensorBoard event file, when --tensorboard-dir is set, starting with the run's config
// and estimate (for `kiln report`); nothing at all otherwise.
std::unique_ptr<TensorBoardObserver> tensorboard_observer(const Trainer& trainer, LogLineObserver& log) {
  const Config& config = trainer.config();
  if (config.tensorboard_dir.empty()) return nullptr;
  const TensorBoardOptions options{.log_interval = config.tensorboard_log_interval,
                                   .log_timers = config.log_timers_to_tensorboard,
                                   .log_batch_size = config.log_batch_size_to_tensorboard,
                                   .log_world_size = config.log_world_size_to_tensorboard,
                                   .log_memory = config.log_memory_to_tensorboard,
                                   .log_validation_ppl = config.log_validation_ppl_to_tensorboard};
  auto observer = std::make_unique<TensorBoardObserver>(
      TensorBoardWriter::create_in(config.tensorboard_dir, static_cast<size_t>(config.tensorboard_queue_size)),
      options, trainer.state().consumed_samples);
  observer->write_run_start(to_yaml(config), to_json(predict_run(config, trainer.backend().description())),
                            trainer.state().iteration);
  log.on_message(fmt::format("TensorBoard events: {}", observer->writer().path()));
  return observer;
}

// This rank's Prometheus endpoint on --metrics-port + its local rank, serving from now on, when
// --metrics-port is set (every rank serves its own); nothing at all otherwise.
std::unique_ptr<PrometheusEndpoint> metrics_endpoint(const Trainer& trainer, const ProcessPlace& place) {
  const Config& config = trainer.config();
  if (config.metrics_port == 0) return nullptr;
  const auto gpu = find_gpu_by_device_name(trainer.backend().description());
  const double peak_tflops = gpu ? gpu->peak_tflops(config.precision_name()) : 0.0;
  return std::make_unique<PrometheusEndpoint>(PrometheusEndpointOptions{
      .address = config.metrics_addr,
      .port = static_cast<int>(config.metrics_port) + place.local_rank,
      .rank = place.rank,
      .cuda_device = config.device == "cuda" ? place.local_rank : -1,
      .training = {.seq_length = config.seq_length, .peak_flops_per_second = peak_tflops * 1e12}});
}

// This rank's step trace (--profile) when its rank is profiled; its folder is checked now, before
// the first step. Nothing at all otherwise.
std::unique_ptr<StepTraceObserver> step_trace_observer(Trainer& trainer, const ProcessPlace& place) {
  const Config& config = trainer.config();
  if (!config.profiles_rank(place.rank, place.world_size)) return nullptr;
  return std::make_unique<StepTraceObserver>(
      StepTraceOptions{.step_start = config.profile_step_start,
                       .step_end = config.profile_step_end,
                       .dir = config.profile_dir.empty() ? config.tensorboard_dir : config.profile_dir,
                       .file_name = step_trace_file_name(config.profile_name, place.rank, place.world_size),
                       .rank = place.rank,
                       .process_name = fmt::format("kiln rank {}", place.rank)},
      *trainer.tracing());
}

// Writes a trace the run's end cut short and says where the trace is, or why there is none.
void finish_step_trace(StepTraceObserver* step_trace, const Trainer& trainer) {
  if (!step_trace) return;
  step_trace->finish();
  const Config& config = trainer.config();
  if (!step_trace->written_path().empty())
    fmt::print("step trace of iteration(s) {}: {} (open it in https://ui.perfetto.dev or chrome://tracing)\n",
               step_trace->written_iterations(), step_trace->written_path());
  else
    fmt::print("no step trace: the run ran no iteration of the traced ones, {}..{} (it ended at iteration {})\n",
               config.profile_step_start + 1, config.profile_step_end, trainer.state().iteration);
}

}  // namespace

void add_train_command(CLI::App& root) {
  auto flags = std::make_shared<ConfigFlags>();
  auto print_config = std::make_shared<bool>(false);
  CLI::App* command = root.add_subcommand("train", "train a model: GPT, or the encoder classifier (--model encoder-classifier)");
  command->add_flag("--print-config", *print_config, "print the resolved config as YAML and exit");
  add_config_flags(*command, flags);
  command->callback([flags, print_config] {
    const Config config = flags->build();
    const ProcessPlace place = find_process_place(process_environment());
    if (*print_config) {
      fmt::print("{}", to_yaml(resolve_config(config, place.world_size)));
      return;
    }
    std::unique_ptr<ProcessGroup> group;
    if (place.joins_group()) {
      const Config wanted = resolve_config(config, place.world_size);
      const std::string backend = wanted.resolved_distributed_backend();
      // validate() lets a process alone name any backend (Megatron's command lines say nccl on a
      // CPU too); a launched one joins a group, whose engine must reduce the device's memory.
      KILN_CHECK((backend == "nccl") == (wanted.device == "cuda"),
                 "--distributed-backend {} with --device {}: NCCL reduces GPU memory and gloo host memory; use {}",
                 backend, wanted.device, wanted.device == "cuda" ? "nccl" : "gloo");
      group = join_process_group(place, backend, wanted.distributed_timeout(), to_yaml(wanted));
    }
    if (config.exit_signal_handler) catch_termination_signal();
    Trainer trainer(config, group ? group->communicator.get() : nullptr, place.local_rank);  // one GPU a local rank
    const std::unique_ptr<PrometheusEndpoint> metrics = metrics_endpoint(trainer, place);
    if (metrics) trainer.add_observer(&metrics->observer());
    const std::unique_ptr<StepTraceObserver> step_trace = step_trace_observer(trainer, place);
    if (step_trace) trainer.add_observer(step_trace.get());
    if (place.rank != 0) {
      trainer.run();  // rank 0 alone prints and writes, but for the traces of --profile-ranks
      finish_step_trace(step_trace.get(), trainer);
      return;
    }
    const Config& resolved = trainer.config();
    LogLineObserver log(resolved.log_interval);
    const auto gpu = find_gpu_by_device_name(trainer.backend().description());
    const auto limits = datasheet_limits_if_any(gpu, resolved.precision_name());
    if (limits) {
      const double ms = roofline(count_iteration_ops(iteration_shape(resolved)), *limits).ms;
      log.on_message(fmt::format(
          "roofline on the {} datasheet: {:.2f} ms per iteration at least, {:.0f} tokens/s at most "
          "(kiln estimate ops lists it op by op)",
          gpu->key, ms, static_cast<double>(resolved.global_batch_size * resolved.seq_length) / (ms * 1e-3)));
    }
    trainer.add_observer(&log);
    if (metrics) log.on_message(metrics->description());
    const std::unique_ptr<TensorBoardObserver> tensorboard = tensorboard_observer(trainer, log);
    if (tensorboard) trainer.add_observer(tensorboard.get());
    trainer.run();
    finish_step_trace(step_trace.get(), trainer);
    if (const OpTimingBackend* timing = trainer.op_timing())
      fmt::print("time by op over the whole run (--profile-ops):\n{}",
                 OpTimingBackend::format(timing->times(), limits ? &*limits : nullptr));
  });
}

}  // namespace kiln::cli
