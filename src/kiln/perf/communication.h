// Data parallelism's communication, before any run (`kiln estimate comm`): the bytes each rank
// sends per iteration under DDP and ZeRO 1/2/3, their time at a bus bandwidth, how much of it the
// backward (or forward) hides, and the step time, tokens/s and scaling efficiency from one GPU to N
// nodes. Pure functions of their inputs; nothing here runs a collective.
//
// Volume (Rajbhandari et al. 2020, "ZeRO", arXiv 1910.02054, section 7): an all-reduce is a
// reduce-scatter plus an all-gather, each moving Psi elements per rank: 2 Psi. ZeRO-1 and -2
// reduce-scatter the gradients (Psi) and all-gather the updated parameters (Psi): 2 Psi, data
// parallelism's volume. ZeRO-3 gathers the parameters in the forward and again in the backward and
// reduce-scatters the gradients: 3 Psi, 1.5x. Exactly, a rank sends (n-1)/n of each Psi over n
// ranks: an all-reduce of S bytes 2 (n-1)/n S, a reduce-scatter or all-gather of S bytes (n-1)/n S
// (nccl-tests, doc/PERFORMANCE.md: true of a ring and of any algorithm made of sends), so one rank
// sends nothing.
// Time: nccl-tests' bus bandwidth is defined by t = S x 2(n-1)/n / busbw for an all-reduce and
// t = S x (n-1)/n / busbw for a reduce-scatter or all-gather, i.e. the bytes a rank sends over busbw.
// Dtypes: a gradient collective moves gradient_bytes per element (kiln reduces its fp32 gradients,
// 4 bytes in every precision), a parameter gather parameter_bytes (what the forward reads: 2 in
// bf16/fp16, 4 in fp32); with equal dtypes the volumes are the paper's.
// Accumulation over `micro_batches`: DDP and ZeRO-1 reduce once, in the last micro-batch's backward
// (kiln's and Megatron's buckets); ZeRO-2 keeps only its shard of the gradients (as the memory
// estimate counts it), so every micro-batch's backward reduce-scatters (DeepSpeed's stage 2);
// ZeRO-3 gathers and reduce-scatters in every micro-batch. ZeRO-1/2 gather the parameters once,
// after the optimizer step.
//
// Hiding, the model used: communication of time t runs beside compute of time c that finishes its
// k buckets evenly (bucket i at c i / k) and the buckets go one at a time over one link. The link
// starts no earlier than c/k and the last bucket no earlier than c, so
//     exposed = max(t - c (1 - 1/k), t / k),   hidden = t - exposed
// (exact for equal buckets and even compute: a link that keeps up shows only the last bucket, t/k;
// one that does not is busy from c/k to c/k + t). Hence 0 <= hidden <= t, and exposed >= t/k > 0.
// The phases and what hides them:
//   gradient all-reduce / reduce-scatter   the backward of the micro-batch it follows (all exposed
//                                          with overlap_grad_reduce off); the last bucket, the
//                                          first layers' gradients finished last, is exposed
//   ZeRO-1/2 parameter all-gather          nothing: it follows the optimizer step; with
//                                          overlap_param_gather (Megatron's flag) the next
//                                          forward, the first layers' bucket exposed
//   ZeRO-3 forward gather                  the forward (the first layers' bucket exposed)
//   ZeRO-3 backward gather + reduce-scatter  the backward, sharing the link
// Unknown compute time: nothing is hidden. Not modelled: each collective's latency (small buckets),
// other traffic on the link, compute slowed by the communication kernels, in-network reduction
// (NVLink SHARP: pass its measured busbw).
//
// Scaling (scaling_table): weak by default (samples per GPU fixed at the reference iteration's),
// or strong (one global batch at every size). Compute per GPU scales with its samples; a GPU's
// step is compute + exposed communication; efficiency = tokens/s at n GPUs / (n x tokens/s at 1).
// Ranks within one node use the intra-node link; once ranks span nodes the ring crosses each
// node's network once per channel, so the node's network bandwidth bounds busbw:
// min(intra, inter), with inter the node's whole network (e.g. 3200 Gb/s = 400 GB/s on a p5).
// Errors name the flag or link at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/perf/estimator.h"

namespace kiln {

// ---- primitives ------------------------------------------------------------------------------

// What each of `ranks` sends in an all-reduce of `bytes`: 2 (n-1)/n x bytes (0 for one rank).
double all_reduce_bytes_per_rank(double bytes, int64_t ranks);
// What each sends in a reduce-scatter or all-gather of `bytes` (the whole array): (n-1)/n x bytes.
double gather_bytes_per_rank(double bytes, int64_t ranks);
// Seconds to send `bytes_per_rank` at nccl-tests' bus bandwidth (GB/s, 1e9 bytes/s).
double transfer_seconds(double bytes_per_rank, double busbw_gb_per_s);
// The hiding model above: the part of `communication_s` that `compute_s`, finishing `buckets`
// buckets evenly, does not hide. No compute (0): all of it.
double exposed_seconds(double communication_s, double compute_s, int64_t buckets);
// The buckets kiln's GradientBuckets cuts (dist/gradient_buckets.h): from the end of the buffer, a
// bucket closes at the first parameter start that makes it hold >= bucket_elements; the rest,
// down to 0, is the last bucket.
int64_t gradient_bucket_count(std::span<const int64_t> parameter_starts, int64_t total_elements,
                              int64_t bucket_elements);

// ---- one configuration -----------------------------------------------------------------------

struct CommunicationInput {
  double parameters = 0;       // Psi, elements
  double gradient_bytes = 4;   // per gradient element as reduced (kiln: fp32)
  double parameter_bytes = 2;  // per parameter element as gathered by ZeRO (the forward's dtype)
  int64_t ranks = 1;           // data-parallel ranks
  int zero_stage = 0;          // 0 (DDP) .. 3
  double busbw_gb_per_s = 0;   // the ring's bus bandwidth; may be 0 only for one rank
  int64_t buckets = 1;         // gradient buckets (also the ZeRO gathers' granularity)
  int64_t micro_batches = 1;   // gradient accumulation steps per iteration
  // One micro-batch's forward and backward on one GPU, when known.
  std::optional<double> forward_seconds, backward_seconds;
  bool overlap_grad_reduce = true;    // buckets reduce during the backward (kiln's default)
  bool overlap_param_gather = false;  // ZeRO-1/2's gather behind the next forward
};

struct CommunicationPhase {
  std::string collective;   // e.g. "reduce-scatter gradients"
  std::string behind;       // what may hide it: "backward", "forward" or "nothing"
  int64_t times = 1;        // per iteration
  double psi = 0;           // volume in multiples of Psi elements, all times together
  double bytes_per_rank = 0, seconds = 0, hidden_seconds = 0, exposed_seconds = 0;  // all times
};

struct CommunicationEstimate {
  double psi = 0;            // the paper's volume per iteration in multiples of Psi: 2, 2, 2, 3 at one micro-batch
  double bytes_per_rank = 0;  // what each rank sends per iteration
  double seconds = 0, hidden_seconds = 0, exposed_seconds = 0;
  std::vector<CommunicationPhase> phases;
  double hidden_share() const { return seconds > 0 ? hidden_seconds / seconds : 0.0; }
};

CommunicationEstimate estimate_communication(const CommunicationInput& in);

// ---- links -----------------------------------------------------------------------------------

struct Link {
  std::string name;  // --link value
  double busbw_gb_per_s = 0;
  std::string basis;  // what the number is (line rate or measured), for the report
};
const std::vector<Link>& named_links();
// The link named `name`; fails naming `flag` and `name` and listing the known ones.
const Link& find_link(std::string_view name, std::string_view flag = "--link");

// ---- scaling ---------------------------------------------------------------------------------

struct ScalingInput {
  CommunicationInput communication;  // ranks, busbw, buckets, micro-batches and times set per row
  std::vector<int64_t> parameter_starts;  // for the bucket count at each size; empty: communication.buckets
  int64_t bucket_elements = 0;            // 0: Megatron's rule at each size (default_bucket_elements)
  int64_t nodes = 1, gpus_per_node = 1;
  std::optional<double> intra_node_busbw, inter_node_busbw;  // GB/s; needed where a row uses them
  double seconds_per_iteration = 0;  // compute of one GPU's share of the reference iteration
  double samples_per_gpu = 0;        // that share, in samples
  int64_t micro_batch = 1, seq_length = 1;
  double forward_share = 1.0 / 3, backward_share = 2.0 / 3;  // of the compute
  std::optional<int64_t> global_batch;  // strong scaling: this batch at every size; nullopt: weak
};

struct ScalingRow {
  int64_t nodes = 1, gpus = 1;
  double busbw_gb_per_s = 0;  // 0 at one GPU
  double samples_per_gpu = 0;
  int64_t micro_batches = 1, buckets = 1;
  double compute_seconds = 0, communication_seconds = 0, exposed_seconds = 0, step_seconds = 0;
  double tokens_per_second = 0, efficiency = 1;
};

// One GPU, then 1, 2, 4, ... nodes and `nodes` itself (one node of one GPU is the first row).
std::vector<ScalingRow> scaling_table(const ScalingInput& in);

// ---- from kiln estimate's configuration ------------------------------------------------------

// What `kiln estimate comm` adds to an EstimateInput.
struct CommunicationOptions {
  std::optional<double> intra_node_busbw, inter_node_busbw;  // GB/s, from --busbw/--link and the inter-node pair
  std::string intra_node_link, inter_node_link;              // names, or "" for a number
  int64_t nodes = 0;                                         // 0: as many as --gpus needs
  int64_t gpus_per_node = 8;
  int64_t ddp_bucket_size = 0;  // elements; 0: max(40 M, 1 M x ranks), kiln train's default
  bool overlap_grad_reduce = true, overlap_param_gather = false;
  bool strong_scaling = false;  // keep --global-batch-size at every size
};

struct CommunicationReport {
  double compute_seconds = 0;  // one GPU's share of the iteration (compute only)
  bool compute_from_roofline = false;  // no speed given: the roofline's least time
  double forward_share = 0, backward_share = 0;  // of the compute, by FLOPs
  int64_t micro_batches = 1, buckets = 1, bucket_elements = 0, nodes = 1;
  double busbw_gb_per_s = 0;  // at --gpus
  bool spans_nodes = false;   // --gpus needs more than one node
  CommunicationEstimate stages[4];  // DDP, ZeRO-1, -2, -3 at --gpus
  double memory_bytes[4] = {};      // per GPU at each stage (estimate's memory, model state restaged)
  std::vector<ScalingRow> scaling;  // at the configuration's ZeRO stage
};

CommunicationReport communication_report(const EstimateInput& in, const Estimate& estimate,
                                         const CommunicationOptions& options);

}  // namespace kiln
