#include "kiln/perf/communication.h"

#include <algorithm>
#include <cmath>

#include "kiln/backend/op_counting.h"
#include "kiln/core/error.h"
#include "kiln/dist/gradient_buckets.h"
#include "kiln/nn/parameters.h"

namespace kiln {
namespace {

bool finite_non_negative(double value) { return value >= 0 && std::isfinite(value); }

// The ring's bus bandwidth for `gpus` ranks on `nodes` nodes: the intra-node link's within one
// node; across nodes each node's network carries what leaves the node, so it bounds the ring.
double ring_busbw(int64_t gpus, int64_t nodes, int64_t gpus_per_node, const std::optional<double>& intra,
                  const std::optional<double>& inter) {
  if (gpus <= 1) return 0;
  if (nodes <= 1) {
    KILN_CHECK(intra.has_value(), "{} GPUs on one node need the intra-node link: give --link (one of nvlink4, "
                                  "pcie4, pcie5, ...) or --busbw GB/s",
               gpus);
    return *intra;
  }
  KILN_CHECK(inter.has_value(), "{} GPUs on {} nodes need the inter-node link: give --inter-node-link (one of "
                                "efa400, efa3200, eth100, ...) or --inter-node-busbw GB/s",
             gpus, nodes);
  if (gpus_per_node == 1) return *inter;
  KILN_CHECK(intra.has_value(), "{} GPUs per node need the intra-node link: give --link (one of nvlink4, pcie4, "
                                "pcie5, ...) or --busbw GB/s",
             gpus_per_node);
  return std::min(*intra, *inter);
}

// 1, 2, 4, ... below `nodes`, then `nodes`.
std::vector<int64_t> node_counts(int64_t nodes) {
  std::vector<int64_t> counts;
  for (int64_t count = 1; count < nodes; count *= 2) counts.push_back(count);
  counts.push_back(nodes);
  return counts;
}

void check_busbw(const std::optional<double>& busbw, const char* flag) {
  KILN_CHECK(!busbw || (*busbw > 0 && std::isfinite(*busbw)), "{} must be a positive number of GB/s, got {}", flag,
             busbw.value_or(0));
}

}  // namespace

double all_reduce_bytes_per_rank(double bytes, int64_t ranks) {
  KILN_CHECK(ranks >= 1, "data-parallel ranks must be >= 1, got {}", ranks);
  const double n = static_cast<double>(ranks);
  return 2 * (n - 1) / n * bytes;
}

double gather_bytes_per_rank(double bytes, int64_t ranks) {
  KILN_CHECK(ranks >= 1, "data-parallel ranks must be >= 1, got {}", ranks);
  const double n = static_cast<double>(ranks);
  return (n - 1) / n * bytes;
}

double transfer_seconds(double bytes_per_rank, double busbw_gb_per_s) {
  if (bytes_per_rank == 0) return 0;
  KILN_CHECK(busbw_gb_per_s > 0 && std::isfinite(busbw_gb_per_s),
             "the bus bandwidth must be a positive number of GB/s, got {}", busbw_gb_per_s);
  return bytes_per_rank / (busbw_gb_per_s * 1e9);
}

double exposed_seconds(double communication_s, double compute_s, int64_t buckets) {
  KILN_CHECK(buckets >= 1, "gradient buckets must be >= 1, got {}", buckets);
  KILN_CHECK(finite_non_negative(communication_s) && finite_non_negative(compute_s),
             "communication ({} s) and compute ({} s) times must be non-negative", communication_s, compute_s);
  const double k = static_cast<double>(buckets);
  // The last bucket can start only when the compute has finished it; the link is free from c/k on.
  return std::min(communication_s, std::max(communication_s - compute_s * (1 - 1 / k), communication_s / k));
}

int64_t gradient_bucket_count(std::span<const int64_t> parameter_starts, int64_t total_elements,
                              int64_t bucket_elements) {
  KILN_CHECK(bucket_elements > 0, "--ddp-bucket-size must be positive, got {}", bucket_elements);
  KILN_CHECK(!parameter_starts.empty() && parameter_starts.front() == 0 &&
                 std::is_sorted(parameter_starts.begin(), parameter_starts.end()),
             "gradient buckets: parameter offsets must ascend from 0");
  int64_t count = 0, end = total_elements;
  for (auto start = parameter_starts.rbegin(); start != parameter_starts.rend(); ++start) {
    if (end - *start >= bucket_elements || *start == 0) {
      if (end > *start) ++count;
      end = *start;
    }
  }
  return std::max<int64_t>(count, 1);
}

CommunicationEstimate estimate_communication(const CommunicationInput& in) {
  KILN_CHECK(finite_non_negative(in.parameters), "parameters must be a non-negative count, got {}", in.parameters);
  KILN_CHECK(in.gradient_bytes > 0 && in.parameter_bytes > 0, "gradient ({}) and parameter ({}) bytes must be positive",
             in.gradient_bytes, in.parameter_bytes);
  KILN_CHECK(in.ranks >= 1, "data-parallel ranks must be >= 1, got {}", in.ranks);
  KILN_CHECK(in.zero_stage >= 0 && in.zero_stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got {}", in.zero_stage);
  KILN_CHECK(in.ranks == 1 || (in.busbw_gb_per_s > 0 && std::isfinite(in.busbw_gb_per_s)),
             "{} ranks need a positive bus bandwidth (GB/s), got {}", in.ranks, in.busbw_gb_per_s);
  KILN_CHECK(in.buckets >= 1, "gradient buckets must be >= 1, got {}", in.buckets);
  KILN_CHECK(in.micro_batches >= 1, "micro-batches per iteration must be >= 1, got {}", in.micro_batches);
  KILN_CHECK(finite_non_negative(in.forward_seconds.value_or(0)) &&
                 finite_non_negative(in.backward_seconds.value_or(0)),
             "forward ({} s) and backward ({} s) times must be non-negative", in.forward_seconds.value_or(0),
             in.backward_seconds.value_or(0));
  const double gradients = in.parameters * in.gradient_bytes, weights = in.parameters * in.parameter_bytes;
  const double forward = in.forward_seconds.value_or(0), backward = in.backward_seconds.value_or(0);
  const double reduce_window = in.overlap_grad_reduce ? backward : 0;

  CommunicationEstimate out;
  // One phase, `times` per iteration, each sending `bytes` per rank beside `window` seconds of compute.
  const auto add = [&](std::string collective, std::string behind, int64_t times, double psi, double bytes,
                       double window) {
    const double seconds = transfer_seconds(bytes, in.busbw_gb_per_s);
    const double exposed = exposed_seconds(seconds, window, in.buckets);
    const double count = static_cast<double>(times);
    CommunicationPhase phase{std::move(collective), window > 0 ? std::move(behind) : "nothing", times,
                             psi * count,           bytes * count, seconds * count, (seconds - exposed) * count,
                             exposed * count};
    out.psi += phase.psi;
    out.bytes_per_rank += phase.bytes_per_rank;
    out.seconds += phase.seconds;
    out.hidden_seconds += phase.hidden_seconds;
    out.exposed_seconds += phase.exposed_seconds;
    out.phases.push_back(std::move(phase));
  };
  const int64_t n = in.ranks, micro = in.micro_batches;
  const auto parameter_gather = [&] {  // ZeRO-1/2: after the step, or behind the next forward
    add("all-gather parameters", "next forward", 1, 1, gather_bytes_per_rank(weights, n),
        in.overlap_param_gather ? forward : 0);
  };
  switch (in.zero_stage) {
    case 0:
      add("all-reduce gradients", "backward", 1, 2, all_reduce_bytes_per_rank(gradients, n), reduce_window);
      break;
    case 1:
      add("reduce-scatter gradients", "backward", 1, 1, gather_bytes_per_rank(gradients, n), reduce_window);
      parameter_gather();
      break;
    case 2:
      add("reduce-scatter gradients", "backward", micro, 1, gather_bytes_per_rank(gradients, n), reduce_window);
      parameter_gather();
      break;
    default:
      add("all-gather parameters (forward)", "forward", micro, 1, gather_bytes_per_rank(weights, n), forward);
      add("all-gather parameters + reduce-scatter gradients (backward)", "backward", micro, 2,
          gather_bytes_per_rank(weights, n) + gather_bytes_per_rank(gradients, n), reduce_window);
  }
  return out;
}

// Each link's bus bandwidth, GB/s (1e9 bytes/s) per direction, and where the number comes from.
const std::vector<Link>& named_links() {
  static const std::vector<Link> links = {
      // H100 SXM: 18 NVLink 4 links, 900 GB/s both ways = 450 GB/s each way (NVIDIA H100 datasheet). A ring
      // all-reduce moves at most the point-to-point rate, measured at 380 of 450 GB/s one way on 8x H100 SXM
      // (p2pBandwidthLatencyTest, NVIDIA/nccl issue #1264); 360 = 80% of 450 is a ring's busbw at large sizes.
      // NCCL's NVLink SHARP all-reduce reduces in the switch and reports 460-480 GB/s busbw on 8x H100 SXM
      // (Alaya NeW's nccl-tests guide): pass --busbw 470 to model it.
      {"nvlink4", 360.0, "NVLink 4 (H100 SXM), a ring's all-reduce busbw: 80% of 450 GB/s each way"},
      // PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s each way; nvbandwidth measures 24.8 GB/s
      // host-to-device on A100 (NVIDIA developer forum, "Asymmetric PCIe bandwidth in bidirectional transfers").
      {"pcie4", 25.0, "PCIe 4.0 x16, measured copy rate (line rate 31.5 GB/s)"},
      // PCIe 5.0 x16: 63.0 GB/s each way; 50 at PCIe 4.0's measured ~80%. 8x H100 PCIe sharing host bridges
      // report 35-45 GB/s all-reduce busbw (Alaya NeW's nccl-tests guide): pass --busbw 40 for such a box.
      {"pcie5", 50.0, "PCIe 5.0 x16 at 80% of its 63 GB/s line rate"},
      // 400 Gb/s of EFA per node (e.g. p4d.24xlarge; AWS's G6e: 4 network cards, 400 Gbps) = 50 GB/s line rate.
      // Measured lower with NCCL 2.9.9: 30-32 GB/s busbw on 3-4 p4d nodes (NVIDIA/nccl issue #527).
      {"efa400", 50.0, "400 Gb/s EFA per node, line rate"},
      // p5.48xlarge/p5e: 32 network cards, 3200 Gbps per node (AWS EC2 User Guide, "Maximize network bandwidth
      // ... with EFA") = 400 GB/s line rate; Perplexity reached 3108 Gbps (97%) point to point over RDMA.
      {"efa3200", 400.0, "3200 Gb/s EFA per node (p5), line rate"},
      // 100 Gb/s Ethernet: 12.5 GB/s line rate; TCP's overhead lowers what NCCL reaches.
      {"eth100", 12.5, "100 Gb/s Ethernet, line rate"},
  };
  return links;
}

const Link& find_link(std::string_view name, std::string_view flag) {
  for (const Link& link : named_links())
    if (link.name == name) return link;
  std::string known;
  for (const Link& link : named_links()) known += (known.empty() ? "" : ", ") + link.name;
  fail("{} '{}' is not a link kiln knows; choose one of {}, or give the bus bandwidth in GB/s", flag, name, known);
}

std::vector<ScalingRow> scaling_table(const ScalingInput& in) {
  KILN_CHECK(in.nodes >= 1, "--nodes must be >= 1, got {}", in.nodes);
  KILN_CHECK(in.gpus_per_node >= 1, "--gpus-per-node must be >= 1, got {}", in.gpus_per_node);
  KILN_CHECK(in.seconds_per_iteration > 0 && std::isfinite(in.seconds_per_iteration),
             "the compute time per iteration must be positive, got {} s", in.seconds_per_iteration);
  KILN_CHECK(in.samples_per_gpu > 0, "samples per GPU must be positive, got {}", in.samples_per_gpu);
  KILN_CHECK(in.micro_batch >= 1 && in.seq_length >= 1, "micro-batch ({}) and sequence ({}) must be >= 1",
             in.micro_batch, in.seq_length);
  KILN_CHECK(!in.global_batch || *in.global_batch >= 1, "--global-batch-size must be positive, got {}",
             in.global_batch.value_or(0));
  check_busbw(in.intra_node_busbw, "--busbw");
  check_busbw(in.inter_node_busbw, "--inter-node-busbw");
  std::vector<std::pair<int64_t, int64_t>> sizes{{1, 1}};  // (nodes, GPUs)
  for (const int64_t nodes : node_counts(in.nodes))
    if (nodes * in.gpus_per_node > 1) sizes.emplace_back(nodes, nodes * in.gpus_per_node);

  std::vector<ScalingRow> rows;
  for (const auto& [nodes, gpus] : sizes) {
    ScalingRow row;
    row.nodes = nodes;
    row.gpus = gpus;
    row.samples_per_gpu = in.global_batch ? static_cast<double>(*in.global_batch) / static_cast<double>(gpus)
                                          : in.samples_per_gpu;
    row.micro_batches =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(row.samples_per_gpu / in.micro_batch - 1e-9)));
    row.compute_seconds = in.seconds_per_iteration * row.samples_per_gpu / in.samples_per_gpu;
    row.busbw_gb_per_s = ring_busbw(gpus, nodes, in.gpus_per_node, in.intra_node_busbw, in.inter_node_busbw);
    CommunicationInput c = in.communication;
    c.ranks = gpus;
    c.busbw_gb_per_s = row.busbw_gb_per_s;
    c.micro_batches = row.micro_batches;
    const double micro = static_cast<double>(row.micro_batches);
    c.forward_seconds = row.compute_seconds * in.forward_share / micro;
    c.backward_seconds = row.compute_seconds * in.backward_share / micro;
    if (!in.parameter_starts.empty()) {
      const int64_t elements =
          in.bucket_elements > 0 ? in.bucket_elements : default_bucket_elements(static_cast<int>(gpus));
      c.buckets = gradient_bucket_count(in.parameter_starts, std::llround(c.parameters), elements);
    }
    row.buckets = c.buckets;
    const CommunicationEstimate comm = estimate_communication(c);
    row.communication_seconds = comm.seconds;
    row.exposed_seconds = comm.exposed_seconds;
    row.step_seconds = row.compute_seconds + row.exposed_seconds;
    row.tokens_per_second =
        row.samples_per_gpu * static_cast<double>(gpus * in.seq_length) / row.step_seconds;
    const double one_gpu = rows.empty() ? 0.0 : rows.front().tokens_per_second;
    row.efficiency = rows.empty() ? 1.0 : row.tokens_per_second / (static_cast<double>(gpus) * one_gpu);
    rows.push_back(row);
  }
  return rows;
}

CommunicationReport communication_report(const EstimateInput& in, const Estimate& estimate,
                                         const CommunicationOptions& options) {
  KILN_CHECK(options.gpus_per_node >= 1, "--gpus-per-node must be >= 1, got {}", options.gpus_per_node);
  KILN_CHECK(options.nodes >= 0, "--nodes must be >= 1, got {}", options.nodes);
  KILN_CHECK(options.ddp_bucket_size >= 0, "--ddp-bucket-size must be >= 0 (0: max(40 M, 1 M x ranks)), got {}",
             options.ddp_bucket_size);
  check_busbw(options.intra_node_busbw, "--busbw");
  check_busbw(options.inter_node_busbw, "--inter-node-busbw");
  CommunicationReport report;
  report.nodes = options.nodes > 0 ? options.nodes : (in.gpus + options.gpus_per_node - 1) / options.gpus_per_node;
  KILN_CHECK(in.gpus <= report.nodes * options.gpus_per_node, "--gpus {} do not fit on --nodes {} x --gpus-per-node {}",
             in.gpus, report.nodes, options.gpus_per_node);
  report.spans_nodes = in.gpus > options.gpus_per_node;

  // Compute: the time per iteration kiln estimate derives (measured, or from a TFLOP/s target), else
  // the roofline's least time. The forward is a third of the no-recomputation FLOPs (72 = 3 x 24 in
  // Narayanan et al.'s form); the backward the rest, recomputation included.
  report.compute_from_roofline = !estimate.has_speed;
  report.compute_seconds = estimate.has_speed ? estimate.seconds_per_iteration : estimate.roofline.ms * 1e-3;
  report.forward_share = estimate.flops_without_recompute / 3 / estimate.flops_per_iteration;
  report.backward_share = 1 - report.forward_share;
  report.micro_batches = in.global_batch_size / (in.micro_batch_size * in.gpus);

  // The buckets cut the flat gradient buffer of the model `in` describes, laid out as kiln train
  // lays it out: the model's own layout, built on the op counter (whose buffers own no memory).
  OpCountingBackend counter;
  const ParameterLayout layout = training_config(in).architecture()->build(counter, DType::F32, 1)->layout();
  std::vector<int64_t> starts;
  for (const ParameterInfo& entry : layout.entries()) starts.push_back(entry.offset);
  report.bucket_elements =
      options.ddp_bucket_size > 0 ? options.ddp_bucket_size : default_bucket_elements(static_cast<int>(in.gpus));
  report.buckets = gradient_bucket_count(starts, layout.total(), report.bucket_elements);
  const int64_t nodes_used = (in.gpus + options.gpus_per_node - 1) / options.gpus_per_node;
  report.busbw_gb_per_s = ring_busbw(in.gpus, nodes_used, options.gpus_per_node, options.intra_node_busbw,
                                     options.inter_node_busbw);

  CommunicationInput c;
  c.parameters = static_cast<double>(layout.total());
  c.gradient_bytes = 4;  // kiln's gradients are fp32 in every precision
  c.parameter_bytes = in.precision == "bf16" || in.precision == "fp16" ? 2 : 4;
  c.ranks = in.gpus;
  c.busbw_gb_per_s = report.busbw_gb_per_s;
  c.buckets = report.buckets;
  c.micro_batches = report.micro_batches;
  const double micro = static_cast<double>(report.micro_batches);
  c.forward_seconds = report.compute_seconds * report.forward_share / micro;
  c.backward_seconds = report.compute_seconds * report.backward_share / micro;
  c.overlap_grad_reduce = options.overlap_grad_reduce;
  c.overlap_param_gather = options.overlap_param_gather;
  const MemoryEstimate given = model_state_bytes(c.parameters, in.precision, in.zero_stage, in.gpus);
  const double other_memory = estimate.memory.total() - given.weights - given.gradients - given.optimizer;
  for (int stage = 0; stage <= 3; ++stage) {
    c.zero_stage = stage;
    report.stages[stage] = estimate_communication(c);
    const MemoryEstimate state = model_state_bytes(c.parameters, in.precision, stage, in.gpus);
    report.memory_bytes[stage] = other_memory + state.weights + state.gradients + state.optimizer;
  }

  ScalingInput scaling;
  scaling.communication = c;
  scaling.communication.zero_stage = in.zero_stage;
  scaling.parameter_starts = starts;
  scaling.bucket_elements = options.ddp_bucket_size;
  scaling.nodes = report.nodes;
  scaling.gpus_per_node = options.gpus_per_node;
  scaling.intra_node_busbw = options.intra_node_busbw;
  scaling.inter_node_busbw = options.inter_node_busbw;
  scaling.seconds_per_iteration = report.compute_seconds;
  scaling.samples_per_gpu = static_cast<double>(in.global_batch_size) / static_cast<double>(in.gpus);
  scaling.micro_batch = in.micro_batch_size;
  scaling.seq_length = in.seq_length;
  scaling.forward_share = report.forward_share;
  scaling.backward_share = report.backward_share;
  if (options.strong_scaling) scaling.global_batch = in.global_batch_size;
  report.scaling = scaling_table(scaling);
  return report;
}

}  // namespace kiln
