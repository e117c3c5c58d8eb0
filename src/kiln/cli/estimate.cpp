// `kiln estimate`: parameters, FLOPs, speed, days to train, memory per GPU and the iteration's
// roofline for a configuration that is not run (perf/estimator.h), as a table or --json, for any
// model kiln train builds (--model, the same flags as kiln train's).
// Reports: all (the default), memory (the memory rows alone), ops (the roofline op by op), levers
// (memory and roofline with one switch changed at a time, perf/levers.h), comm (data parallelism's
// communication by ZeRO stage and the scaling table over nodes, perf/communication.h). comm is a
// report of its own, like the others: it takes flags of its own (links, nodes, buckets, overlap) that
// the other reports do not read, and needs no speed input (without one it times the roofline).
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <nlohmann/json.hpp>

#include "kiln/cli/commands.h"
#include "kiln/core/error.h"
#include "kiln/perf/communication.h"
#include "kiln/perf/estimator.h"
#include "kiln/perf/levers.h"
#include "kiln/train/model_kinds.h"

namespace kiln::cli {
namespace {

struct EstimateOptions {
  EstimateInput input;
  double time_per_iteration = 0, tflops_per_gpu = 0;
  std::string recompute_granularity = "none", recompute_method;
  int64_t recompute_num_layers = 1;
  bool no_deterministic_attention = false;
  bool json = false;
  std::string report = "all";  // all, memory, ops, levers, comm
  // comm: the links as names or GB/s (one of each pair), nodes, buckets, overlap, scaling kind.
  std::string link, inter_node_link;
  double busbw = 0, inter_node_busbw = 0;
  CommunicationOptions comm;
  bool no_overlap_grad_reduce = false;
};

constexpr double kGiB = 1073741824.0;

void print_speed(const EstimateInput& in, const Estimate& e);
void print_roofline(const EstimateInput& in, const Estimate& e);
void print_roofline_ops(const Roofline& roofline);
void print_memory(const Estimate& e);

std::string precision_name(const EstimateInput& in) {
  if (in.fp8_format.empty()) return in.precision;
  return in.precision + " + fp8 " + in.fp8_format + (in.fp8_classifier ? " (classifier too)" : "");
}

// The first line of a report: what is estimated, for which configuration (the model as kiln
// train's log describes it), on `gpu`.
void print_header(const std::string& title, const EstimateInput& in, const std::string& gpu,
                  const std::string& suffix = "") {
  fmt::print("# {} | {} | global batch {}, micro-batch {}, {} x {} | {} | ZeRO-{} | recompute {}{}\n", title,
             training_config(in).architecture()->describe(), in.global_batch_size, in.micro_batch_size, in.gpus, gpu,
             precision_name(in), in.zero_stage, in.recompute.describe(), suffix);
}

void print_estimate(const EstimateInput& in, const Estimate& e, const std::string& report) {
  print_header("kiln estimate", in, e.gpu.key);
  fmt::print("parameters            {:.4g} (closed form), {} (exact, as kiln builds it)\n", e.parameters_formula,
             e.parameters_exact);
  if (report == "all") print_speed(in, e);
  if (report != "memory") print_roofline(in, e);
  if (report == "ops") return print_roofline_ops(e.roofline);
  print_memory(e);
}

void print_speed(const EstimateInput& in, const Estimate& e) {
  fmt::print("FLOPs per iteration   {:.4g} without recomputation, {:.4g} with full recomputation\n",
             e.flops_without_recompute, e.flops_with_full_recompute);
  fmt::print("time per iteration    {:.4g} s at {:.1f} TFLOP/s per GPU = {:.1f}% of the {} {} peak ({:.0f})\n",
             e.seconds_per_iteration, e.achieved_tflops_per_gpu, 100 * e.share_of_peak, e.gpu.key, in.precision,
             e.gpu.peak_tflops(in.precision));
  fmt::print("training time         {:.1f} days for {:.3g} tokens on {} GPUs (8TP/nX, recomputation); "
             "{:.1f} days (6TP/nX, none)\n",
             e.days_with_recompute, in.tokens, in.gpus, e.days_without_recompute);
}

void print_roofline(const EstimateInput& in, const Estimate& e) {
  const Roofline& r = e.roofline;
  fmt::print("roofline              {:.4g} ms per iteration on one GPU at least, at the {} datasheet's {:.0f} TFLOP/s "
             "({}) and {:.2f} TB/s: {:.4g} ms in compute-bound ops, {:.4g} ms in memory-bound ones; at most {:.4g} "
             "tokens/s per GPU, MFU at most {:.1f}% of the {} peak (model FLOPs without recomputation)\n",
             r.ms, e.gpu.key, r.limits.tflops, in.precision, r.limits.bandwidth_gb_per_s * 1e-3, r.compute_bound_ms,
             r.memory_bound_ms, e.roofline_tokens_per_second,
             100 * e.flops_without_recompute / static_cast<double>(in.gpus) / (r.ms * 1e-3) / (r.limits.tflops * 1e12),
             in.precision);
}

// "pass GB": the part of GB that passes of their own move (fp8 casts, op_work.h), added to the
// bound the rest sets; "bound" says which bound that is.
void print_roofline_ops(const Roofline& roofline) {
  fmt::print("{:<56} {:>7} {:>11} {:>10} {:>8} {:>8} {:>10} {:>7}\n", "op (one GPU, one iteration)", "calls", "GFLOP",
             "GB", "pass GB", "bound", "least ms", "share");
  for (const RooflineOp& op : roofline.ops)
    fmt::print("{:<56} {:>7} {:>11.1f} {:>10.2f} {:>8.2f} {:>8} {:>10.3f} {:>6.1f}%\n", op.totals.op, op.totals.calls,
               op.totals.flops * 1e-9, op.totals.bytes * 1e-9, op.totals.pass_bytes * 1e-9,
               op.compute_bound ? "compute" : "memory", op.ms, 100 * op.ms / roofline.ms);
  fmt::print("{:<56} {:>7} {:>11} {:>10} {:>8} {:>8} {:>10.3f}\n", "all ops", "", "", "", "", "", roofline.ms);
}

void print_memory(const Estimate& e) {
  const std::string fp8 =
      e.memory.fp8_scaling > 0 ? fmt::format(" + fp8 scaling {:.2f} GiB", e.memory.fp8_scaling / kGiB) : "";
  fmt::print("memory per GPU        weights {:.2f} GiB + gradients {:.2f} GiB + optimizer {:.2f} GiB + "
             "activations {:.2f} GiB + op scratch {:.2f} GiB{} = {:.2f} GiB of {:.0f} GiB\n",
             e.memory.weights / kGiB, e.memory.gradients / kGiB, e.memory.optimizer / kGiB,
             e.memory.activations / kGiB, e.memory.workspace / kGiB, fp8, e.memory.total() / kGiB,
             e.gpu.memory_gib);
  fmt::print("                      (activations as kiln lays them out, in the precision's dtype, keeping no "
             "attention probabilities; Korthikanti et al. per layer: {:.2f} GiB, {:.3f} GiB with full recomputation)\n",
             e.korthikanti_layer_bytes / kGiB, e.korthikanti_layer_bytes_full_recompute / kGiB);
  fmt::print("largest micro-batch   {} fits on one {}\n", e.largest_micro_batch, e.gpu.key);
}

void print_levers(const EstimateInput& in, const std::vector<LeverEstimate>& levers) {
  print_header("kiln estimate levers", in, in.gpu, " | one switch changed at a time");
  fmt::print("{:<56} {:>11} {:>5} {:>12} {:>18}\n", "change", "memory GiB", "fits", "roofline ms",
             "tokens/s at most");
  for (const LeverEstimate& lever : levers) {
    if (!lever.estimate) {
      fmt::print("{:<56} does not apply: {}\n", lever.change, lever.not_applicable);
      continue;
    }
    const Estimate& e = *lever.estimate;
    fmt::print("{:<56} {:>11.2f} {:>5} {:>12.2f} {:>18.0f}\n", lever.change, e.memory.total() / kGiB,
               e.fits ? "yes" : "no", e.roofline.ms, e.roofline_tokens_per_second);
  }
  fmt::print("(memory per GPU as kiln lays it out; roofline: the least time of one GPU's iteration at the {} "
             "datasheet's rates, kiln estimate ops)\n",
             in.gpu);
}

void print_levers_json(const std::vector<LeverEstimate>& levers) {
  nlohmann::json rows = nlohmann::json::array();
  for (const LeverEstimate& lever : levers) {
    if (!lever.estimate) {
      rows.push_back({{"change", lever.change}, {"not_applicable", lever.not_applicable}});
      continue;
    }
    const Estimate& e = *lever.estimate;
    rows.push_back({{"change", lever.change}, {"memory_bytes", e.memory.total()}, {"fits", e.fits},
                    {"roofline_ms_per_iteration", e.roofline.ms},
                    {"roofline_tokens_per_second_per_gpu", e.roofline_tokens_per_second}});
  }
  fmt::print("{}\n", nlohmann::json{{"levers", rows}}.dump());
}

void print_json(const EstimateInput& in, const Estimate& e, const std::string& report) {
  nlohmann::json out = {
      {"model", in.model}, {"gpu", e.gpu.key}, {"precision", in.precision}, {"fp8_format", in.fp8_format},
      {"fp8_classifier", in.fp8_classifier}, {"loss_chunk_rows", in.loss_chunk_rows}, {"gpus", in.gpus},
      {"zero_stage", in.zero_stage},
      {"recompute", in.recompute.describe()}, {"parameters_formula", e.parameters_formula},
      {"parameters_exact", e.parameters_exact}, {"flops_per_iteration", e.flops_per_iteration},
      {"flops_without_recompute", e.flops_without_recompute},
      {"flops_with_full_recompute", e.flops_with_full_recompute},
      {"memory_bytes", {{"weights", e.memory.weights}, {"gradients", e.memory.gradients},
                        {"optimizer", e.memory.optimizer}, {"activations", e.memory.activations},
                        {"op_scratch", e.memory.workspace}, {"fp8_scaling", e.memory.fp8_scaling},
                        {"total", e.memory.total()}}},
      {"korthikanti_layer_bytes", e.korthikanti_layer_bytes},
      {"largest_micro_batch", e.largest_micro_batch},
      {"roofline", {{"ms_per_iteration", e.roofline.ms}, {"compute_bound_ms", e.roofline.compute_bound_ms},
                    {"memory_bound_ms", e.roofline.memory_bound_ms},
                    {"tokens_per_second_per_gpu", e.roofline_tokens_per_second},
                    {"tflops", e.roofline.limits.tflops}, {"fp8_tflops", e.roofline.limits.fp8_tflops},
                    {"bandwidth_gb_per_s", e.roofline.limits.bandwidth_gb_per_s}}}};
  if (report == "ops") {
    out["roofline"]["ops"] = nlohmann::json::array();
    for (const RooflineOp& op : e.roofline.ops)
      out["roofline"]["ops"].push_back({{"op", op.totals.op}, {"calls", op.totals.calls}, {"flops", op.totals.flops},
                                        {"bytes", op.totals.bytes}, {"pass_bytes", op.totals.pass_bytes},
                                        {"fp8", op.totals.fp8},
                                        {"compute_bound", op.compute_bound}, {"ms", op.ms}});
  }
  if (e.has_speed)
    out.update({{"seconds_per_iteration", e.seconds_per_iteration}, {"tflops_per_gpu", e.achieved_tflops_per_gpu},
                {"share_of_peak", e.share_of_peak}, {"tokens", in.tokens},
                {"days_with_recompute", e.days_with_recompute}, {"days_without_recompute", e.days_without_recompute}});
  fmt::print("{}\n", out.dump());
}

// "nvlink4 (360 GB/s: ...)" or "--busbw 100 GB/s".
std::string link_text(const std::string& name, const std::optional<double>& busbw, const char* flag) {
  if (!busbw) return "(none given)";
  if (name.empty()) return fmt::format("{} {:g} GB/s", flag, *busbw);
  return fmt::format("{} ({:g} GB/s: {})", name, *busbw, find_link(name).basis);
}

std::string counted(int64_t count, const char* one, const char* many) {
  return fmt::format("{} {}", count, count == 1 ? one : many);
}

std::string ms_or_dash(double seconds, bool none) { return none ? "-" : fmt::format("{:.3f}", seconds * 1e3); }

constexpr const char* kStageNames[4] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};

void print_comm(const EstimateInput& in, const EstimateOptions& options, const Estimate& e,
                const CommunicationReport& r) {
  print_header("kiln estimate comm", in, e.gpu.key);
  const std::string source =
      r.compute_from_roofline
          ? "the roofline's least time, no --tflops-per-gpu or --time-per-iteration given"
      : in.time_per_iteration_s
          ? fmt::format("--time-per-iteration, {:.1f} TFLOP/s per GPU", e.achieved_tflops_per_gpu)
          : fmt::format("at {:.1f} TFLOP/s per GPU", e.achieved_tflops_per_gpu);
  fmt::print("compute               {:.4g} ms per iteration on one GPU ({}); forward {:.1f}%, backward {:.1f}% of it "
             "by FLOPs; {} per iteration\n",
             r.compute_seconds * 1e3, source, 100 * r.forward_share, 100 * r.backward_share,
             counted(r.micro_batches, "micro-batch", "micro-batches"));
  fmt::print("gradients             {} parameters (Psi), reduced in fp32 (4 bytes), gathered by ZeRO in {} ({} bytes); "
             "{} of >= {} elements ({})\n",
             e.parameters_exact, in.precision == "bf16" || in.precision == "fp16" ? in.precision : "fp32",
             in.precision == "bf16" || in.precision == "fp16" ? 2 : 4, counted(r.buckets, "bucket", "buckets"),
             r.bucket_elements,
             options.comm.ddp_bucket_size > 0 ? "--ddp-bucket-size" : "max(40 M, 1 M x ranks), kiln train's default");
  const bool one_gpu = in.gpus == 1;
  if (one_gpu)
    fmt::print("link                  1 GPU: nothing to communicate (give --gpus N for the rows below)\n");
  else
    fmt::print("link                  {} GPUs {}: {:g} GB/s bus bandwidth (time = bytes a rank sends / busbw, "
               "nccl-tests)\n",
               in.gpus, r.spans_nodes ? "across nodes, bounded by the inter-node link" : "on one node",
               r.busbw_gb_per_s);
  fmt::print("{:<8} {:>12} {:>17} {:>12} {:>10} {:>7} {:>11} {:>11}\n", "stage", "volume (Psi)", "GB sent per rank",
             "comm ms", "hidden ms", "hidden", "exposed ms", "memory GiB");
  for (int stage = 0; stage <= 3; ++stage) {
    const CommunicationEstimate& c = r.stages[stage];
    fmt::print("{:<8} {:>12g} {:>17.3f} {:>12} {:>10} {:>7} {:>11} {:>11.2f}{}\n", kStageNames[stage], c.psi,
               c.bytes_per_rank * 1e-9, ms_or_dash(c.seconds, one_gpu), ms_or_dash(c.hidden_seconds, one_gpu),
               one_gpu ? "-" : fmt::format("{:.1f}%", 100 * c.hidden_share()), ms_or_dash(c.exposed_seconds, one_gpu),
               r.memory_bytes[stage] / kGiB, stage == in.zero_stage ? "  <- --zero-stage" : "");
  }
  for (const CommunicationPhase& phase : r.stages[in.zero_stage].phases)
    fmt::print("  {} x{}: {:.3f} GB per rank, {} ms, {}\n", phase.collective, phase.times,
               phase.bytes_per_rank * 1e-9, ms_or_dash(phase.seconds, one_gpu),
               phase.behind == "nothing"
                   ? std::string("all exposed (nothing hides it)")
                   : fmt::format("{} ms hidden behind the {}", ms_or_dash(phase.hidden_seconds, one_gpu),
                                 phase.behind));
  fmt::print("(volume: the ZeRO paper's, 2 Psi for an all-reduce, 3 Psi for ZeRO-3, per micro-batch for ZeRO-2's "
             "reduce-scatter and all of ZeRO-3; a rank sends (n-1)/n of it, in its dtype; hidden: the backward "
             "hides every bucket but the last, the first layers'; ZeRO-1/2's parameter gather follows the "
             "step{}; memory: kiln estimate memory at each stage)\n",
             options.comm.overlap_param_gather ? " and hides behind the next forward" : ", exposed");

  const std::string kind =
      options.comm.strong_scaling
          ? fmt::format("strong: global batch {} at every size", in.global_batch_size)
          : fmt::format("weak: {:g} samples per GPU at every size",
                        static_cast<double>(in.global_batch_size) / static_cast<double>(in.gpus));
  fmt::print("scaling               {}, {}; {} GPUs per node; within a node {}, across nodes {} per node\n",
             kStageNames[in.zero_stage], kind, options.comm.gpus_per_node,
             link_text(options.link, options.comm.intra_node_busbw, "--busbw"),
             link_text(options.inter_node_link, options.comm.inter_node_busbw, "--inter-node-busbw"));
  fmt::print("{:>5} {:>6} {:>10} {:>11} {:>10} {:>10} {:>11} {:>12} {:>10}\n", "nodes", "GPUs", "busbw GB/s",
             "compute ms", "comm ms", "exposed ms", "step ms", "tokens/s", "efficiency");
  for (const ScalingRow& row : r.scaling) {
    const bool alone = row.gpus == 1;
    fmt::print("{:>5} {:>6} {:>10} {:>11.3f} {:>10} {:>10} {:>11.3f} {:>12.0f} {:>9.1f}%\n", row.nodes, row.gpus,
               alone ? "-" : fmt::format("{:g}", row.busbw_gb_per_s), row.compute_seconds * 1e3,
               ms_or_dash(row.communication_seconds, alone), ms_or_dash(row.exposed_seconds, alone),
               row.step_seconds * 1e3, row.tokens_per_second, 100 * row.efficiency);
  }
  fmt::print("(step = compute + exposed communication; efficiency = tokens/s at n GPUs / (n x tokens/s at 1 GPU))\n");
}

void print_comm_json(const EstimateInput& in, const EstimateOptions& options, const Estimate& e,
                     const CommunicationReport& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (int stage = 0; stage <= 3; ++stage) {
    const CommunicationEstimate& c = r.stages[stage];
    nlohmann::json phases = nlohmann::json::array();
    for (const CommunicationPhase& p : c.phases)
      phases.push_back({{"collective", p.collective}, {"behind", p.behind}, {"times", p.times}, {"psi", p.psi},
                        {"bytes_per_rank", p.bytes_per_rank}, {"seconds", p.seconds},
                        {"hidden_seconds", p.hidden_seconds}, {"exposed_seconds", p.exposed_seconds}});
    stages.push_back({{"zero_stage", stage}, {"name", kStageNames[stage]}, {"psi", c.psi},
                      {"bytes_per_rank", c.bytes_per_rank}, {"seconds", c.seconds},
                      {"hidden_seconds", c.hidden_seconds}, {"hidden_share", c.hidden_share()},
                      {"exposed_seconds", c.exposed_seconds}, {"memory_bytes", r.memory_bytes[stage]},
                      {"phases", phases}});
  }
  nlohmann::json scaling = nlohmann::json::array();
  for (const ScalingRow& row : r.scaling)
    scaling.push_back({{"nodes", row.nodes}, {"gpus", row.gpus}, {"busbw_gb_per_s", row.busbw_gb_per_s},
                       {"samples_per_gpu", row.samples_per_gpu}, {"micro_batches", row.micro_batches},
                       {"buckets", row.buckets}, {"compute_seconds", row.compute_seconds},
                       {"communication_seconds", row.communication_seconds},
                       {"exposed_seconds", row.exposed_seconds}, {"step_seconds", row.step_seconds},
                       {"tokens_per_second", row.tokens_per_second}, {"efficiency", row.efficiency}});
  const auto busbw_or_null = [](const std::optional<double>& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  const nlohmann::json out = {
      {"model", in.model}, {"gpu", e.gpu.key}, {"precision", in.precision}, {"gpus", in.gpus},
      {"zero_stage", in.zero_stage}, {"parameters_exact", e.parameters_exact},
      {"communication",
       {{"compute_seconds", r.compute_seconds}, {"compute_from_roofline", r.compute_from_roofline},
        {"forward_share", r.forward_share}, {"backward_share", r.backward_share},
        {"micro_batches", r.micro_batches}, {"buckets", r.buckets}, {"bucket_elements", r.bucket_elements},
        {"busbw_gb_per_s", r.busbw_gb_per_s}, {"spans_nodes", r.spans_nodes},
        {"link", options.link}, {"intra_node_busbw_gb_per_s", busbw_or_null(options.comm.intra_node_busbw)},
        {"inter_node_link", options.inter_node_link},
        {"inter_node_busbw_gb_per_s", busbw_or_null(options.comm.inter_node_busbw)},
        {"overlap_grad_reduce", options.comm.overlap_grad_reduce},
        {"overlap_param_gather", options.comm.overlap_param_gather}, {"stages", stages}}},
      {"scaling",
       {{"kind", options.comm.strong_scaling ? "strong" : "weak"}, {"nodes", r.nodes},
        {"gpus_per_node", options.comm.gpus_per_node}, {"rows", scaling}}}};
  fmt::print("{}\n", out.dump());
}

// --link NAME or --busbw GB/s (not both): the bus bandwidth, or nullopt when neither is given.
std::optional<double> resolve_link(const std::string& name, const char* link_flag, double busbw,
                                   const char* busbw_flag) {
  KILN_CHECK(name.empty() || busbw == 0, "give one of {} (a named link) and {} (GB/s), not both", link_flag,
             busbw_flag);
  if (!name.empty()) return find_link(name, link_flag).busbw_gb_per_s;
  if (busbw != 0) {
    KILN_CHECK(busbw > 0 && std::isfinite(busbw), "{} must be a positive number of GB/s, got {}", busbw_flag, busbw);
    return busbw;
  }
  return std::nullopt;
}

}  // namespace

void add_estimate_command(CLI::App& root) {
  auto options = std::make_shared<EstimateOptions>();
  EstimateInput& in = options->input;
  CLI::App* command =
      root.add_subcommand("estimate", "predict parameters, FLOPs, speed, days, memory and the roofline");
  command->add_option("report", options->report,
                      "all (default), memory (the memory rows alone), ops (the roofline op by op), levers "
                      "(memory and roofline with one switch changed at a time) or comm (data parallelism's "
                      "communication by ZeRO stage and the scaling table over nodes)")
      ->check(CLI::IsMember({"all", "memory", "ops", "levers", "comm"}));
  std::string models;
  for (const ModelKind& kind : model_kinds()) models += fmt::format("{}{}", models.empty() ? "" : " or ", kind.name);
  command->add_option("--model", in.model, "the model, as kiln train's --model: " + models + " (default gpt)");
  command->add_option("--num-layers", in.num_layers, "transformer blocks")->required();
  command->add_option("--hidden-size", in.hidden_size, "model width")->required();
  command->add_option("--num-attention-heads", in.num_attention_heads, "attention heads")->required();
  command->add_option("--seq-length", in.seq_length, "tokens per sample")->required();
  command->add_option("--vocab-size", in.vocab_size, "vocabulary size")->required();
  command->add_option("--num-intermediate-layers", in.num_intermediate_layers,
                      "encoder-classifier: residual Linear+GELU layers after the blocks (default 2)");
  command->add_option("--num-labels", in.num_labels, "encoder-classifier: classes (default 2)");
  command->add_option("--global-batch-size", in.global_batch_size, "samples per iteration")->required();
  command->add_option("--micro-batch-size", in.micro_batch_size, "samples per forward/backward on one GPU");
  command->add_option("--gpus", in.gpus, "data-parallel GPUs");
  command->add_option("--gpu", in.gpu, "h100-sxm, h100-pcie, h200, a100-80gb, a100-40gb, l40s, a10, v100");
  command->add_option("--precision", in.precision, "fp32, tf32, bf16, fp16");
  command->add_option("--fp8-format", in.fp8_format, "fp8 products in the blocks (with bf16): hybrid or e4m3");
  command->add_flag("--fp8-classifier", in.fp8_classifier, "the classifier's products in fp8 too (with --fp8-format)");
  command->add_option("--fp8-amax-history-len", in.fp8_amax_history_len, "steps of amax kept per fp8 tensor");
  command->add_option("--loss-chunk-rows", in.loss_chunk_rows,
                      "positions the classifier and loss take at a time (logits in memory for so many rows)");
  command->add_option("--time-per-iteration", options->time_per_iteration, "measured seconds per iteration");
  command->add_option("--tflops-per-gpu", options->tflops_per_gpu, "target achieved TFLOP/s per GPU");
  command->add_option("--tokens", in.tokens, "training budget in tokens (e.g. 300e9)");
  command->add_option("--zero-stage", in.zero_stage, "0-3: shard optimizer state, gradients, weights");
  command->add_option("--recompute-granularity", options->recompute_granularity, "none, full, selective");
  command->add_option("--recompute-method", options->recompute_method, "uniform or block");
  command->add_option("--recompute-num-layers", options->recompute_num_layers, "N of the method");
  command->add_flag("--no-deterministic-attention", options->no_deterministic_attention,
                    "the attention backward adding dQ in fp32 atomics (its sums in the op scratch)");
  command->add_flag("--json", options->json, "one JSON object");
  // kiln estimate comm
  command->add_option("--link", options->link,
                      "comm: the intra-node link, nvlink4, pcie4, pcie5, efa400, efa3200, eth100");
  command->add_option("--busbw", options->busbw, "comm: the intra-node bus bandwidth in GB/s (instead of --link)");
  command->add_option("--inter-node-link", options->inter_node_link, "comm: the link between nodes (e.g. efa3200)");
  command->add_option("--inter-node-busbw", options->inter_node_busbw,
                      "comm: each node's network in GB/s (instead of --inter-node-link)");
  command->add_option("--nodes", options->comm.nodes, "comm: the scaling table's largest node count (default: "
                                                      "as many as --gpus needs)");
  command->add_option("--gpus-per-node", options->comm.gpus_per_node, "comm: GPUs per node (default 8)");
  command->add_option("--ddp-bucket-size", options->comm.ddp_bucket_size,
                      "comm: gradient elements a bucket (0: max(40 M, 1 M x ranks), as kiln train)");
  command->add_flag("--no-overlap-grad-reduce", options->no_overlap_grad_reduce,
                    "comm: reduce the gradients after the backward, not during it");
  command->add_flag("--overlap-param-gather", options->comm.overlap_param_gather,
                    "comm: ZeRO-1/2's parameter gather behind the next forward");
  command->add_flag("--strong-scaling", options->comm.strong_scaling,
                    "comm: keep --global-batch-size at every size (default: samples per GPU fixed)");
  command->callback([options] {
    EstimateInput input = options->input;
    if (options->time_per_iteration != 0) input.time_per_iteration_s = options->time_per_iteration;
    if (options->tflops_per_gpu != 0) input.tflops_per_gpu = options->tflops_per_gpu;
    input.deterministic_attention = !options->no_deterministic_attention;
    input.recompute = RecomputePolicy::parse(options->recompute_granularity, options->recompute_method,
                                             options->recompute_num_layers);
    if (options->report == "comm") {
      CommunicationOptions comm = options->comm;
      comm.intra_node_busbw = resolve_link(options->link, "--link", options->busbw, "--busbw");
      comm.inter_node_busbw =
          resolve_link(options->inter_node_link, "--inter-node-link", options->inter_node_busbw, "--inter-node-busbw");
      comm.intra_node_link = options->link;
      comm.inter_node_link = options->inter_node_link;
      comm.overlap_grad_reduce = !options->no_overlap_grad_reduce;
      EstimateOptions shown = *options;
      shown.comm = comm;
      const Estimate result = estimate(input);
      const CommunicationReport report = communication_report(input, result, comm);
      options->json ? print_comm_json(input, shown, result, report) : print_comm(input, shown, result, report);
      return;
    }
    if (options->report == "levers") {
      const std::vector<LeverEstimate> levers = estimate_levers(input);
      options->json ? print_levers_json(levers) : print_levers(input, levers);
      return;
    }
    KILN_CHECK(options->report != "all" || input.time_per_iteration_s || input.tflops_per_gpu,
               "give one of --time-per-iteration (measured seconds) and --tflops-per-gpu (a target) for the "
               "speed and days rows, or ask for the memory rows alone (kiln estimate memory ...) or the roofline "
               "(kiln estimate ops ...) or what each switch buys (kiln estimate levers ...)");
    const Estimate result = estimate(input);
    options->json ? print_json(input, result, options->report) : print_estimate(input, result, options->report);
  });
}

}  // namespace kiln::cli
