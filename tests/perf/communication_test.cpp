// Data parallelism's communication (perf/communication.h) against the ZeRO paper's volumes, the
// nccl-tests bus-bandwidth definition and the hiding model, worked out by hand in the comments; and
// `kiln estimate comm` through the real binary.
#include "kiln/perf/communication.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/dist/gradient_buckets.h"
#include "kiln/nn/encoder_classifier.h"
#include "kiln/train/model_kinds.h"
#include "support/error_of.h"
#include "support/kiln_process.h"
#include "support/small_estimate.h"

namespace kiln {
namespace {

using testing::error_of;

// Psi = 1e9 parameters, 2-byte gradients and weights (the paper's fp16 layout), 8 ranks at 100 GB/s.
CommunicationInput billion_on_eight(int stage) {
  CommunicationInput in;
  in.parameters = 1e9;
  in.gradient_bytes = 2;
  in.parameter_bytes = 2;
  in.ranks = 8;
  in.busbw_gb_per_s = 100;
  in.zero_stage = stage;
  return in;
}

TEST(Communication, ZeroVolumesAreTwoTwoTwoThreePsi) {
  // Volume 2 Psi, 2 Psi, 2 Psi, 3 Psi; in bytes 4e9, 4e9, 4e9, 6e9; a rank sends 7/8 of it.
  const double psi[] = {2, 2, 2, 3};
  for (int stage = 0; stage <= 3; ++stage) {
    const CommunicationEstimate c = estimate_communication(billion_on_eight(stage));
    EXPECT_DOUBLE_EQ(c.psi, psi[stage]) << "ZeRO-" << stage;
    EXPECT_DOUBLE_EQ(c.bytes_per_rank, psi[stage] * 2e9 * 7 / 8) << "ZeRO-" << stage;
  }
  // DDP: one all-reduce; ZeRO-1/2: a reduce-scatter and an all-gather; ZeRO-3: a gather in the
  // forward, and a gather with the reduce-scatter in the backward.
  EXPECT_EQ(estimate_communication(billion_on_eight(0)).phases.size(), 1u);
  EXPECT_EQ(estimate_communication(billion_on_eight(2)).phases.size(), 2u);
  EXPECT_EQ(estimate_communication(billion_on_eight(3)).phases.size(), 2u);
}

TEST(Communication, KilnsDtypesAndAccumulation) {
  // kiln reduces fp32 gradients (4 bytes) and ZeRO gathers bf16 weights (2 bytes):
  // DDP 2 x 4e9 x 7/8 = 7e9; ZeRO-1 (4e9 + 2e9) x 7/8 = 5.25e9; ZeRO-3 (2e9 + 2e9 + 4e9) x 7/8 = 7e9.
  CommunicationInput in = billion_on_eight(0);
  in.gradient_bytes = 4;
  EXPECT_DOUBLE_EQ(estimate_communication(in).bytes_per_rank, 7e9);
  in.zero_stage = 1;
  EXPECT_DOUBLE_EQ(estimate_communication(in).bytes_per_rank, 5.25e9);
  in.zero_stage = 3;
  EXPECT_DOUBLE_EQ(estimate_communication(in).bytes_per_rank, 7e9);
  // Four micro-batches: DDP and ZeRO-1 still reduce once; ZeRO-2 reduce-scatters each micro-batch
  // (4 + 1 = 5 Psi); ZeRO-3 does everything each micro-batch (12 Psi).
  in.micro_batches = 4;
  const double psi[] = {2, 2, 5, 12};
  for (int stage = 0; stage <= 3; ++stage) {
    in.zero_stage = stage;
    EXPECT_DOUBLE_EQ(estimate_communication(in).psi, psi[stage]) << "ZeRO-" << stage;
  }
}

TEST(Communication, RingFactorAtOneTwoAndEightRanks) {
  EXPECT_DOUBLE_EQ(all_reduce_bytes_per_rank(1e9, 1), 0.0);  // one rank: nothing to send
  EXPECT_DOUBLE_EQ(gather_bytes_per_rank(1e9, 1), 0.0);
  EXPECT_DOUBLE_EQ(all_reduce_bytes_per_rank(1e9, 2), 1e9);     // 2 (2-1)/2 = 1
  EXPECT_DOUBLE_EQ(gather_bytes_per_rank(1e9, 2), 0.5e9);       // (2-1)/2
  EXPECT_DOUBLE_EQ(all_reduce_bytes_per_rank(1e9, 8), 1.75e9);  // 2 x 7/8
  EXPECT_DOUBLE_EQ(gather_bytes_per_rank(1e9, 8), 0.875e9);     // 7/8
  // One rank needs no link at all.
  CommunicationInput alone = billion_on_eight(3);
  alone.ranks = 1;
  alone.busbw_gb_per_s = 0;
  const CommunicationEstimate c = estimate_communication(alone);
  EXPECT_EQ(c.bytes_per_rank, 0.0);
  EXPECT_EQ(c.seconds, 0.0);
  EXPECT_EQ(c.exposed_seconds, 0.0);
}

TEST(Communication, TimeIsBytesOverBusBandwidth) {
  EXPECT_DOUBLE_EQ(transfer_seconds(1e9, 100), 0.01);  // 1 GB at 100 GB/s
  // nccl-tests: an all-reduce of S = 2e9 bytes on 8 ranks at busbw B takes S x 2 x 7/8 / B = 35 ms.
  const CommunicationEstimate ddp = estimate_communication(billion_on_eight(0));
  EXPECT_DOUBLE_EQ(ddp.seconds, 0.035);
  EXPECT_DOUBLE_EQ(ddp.seconds, ddp.bytes_per_rank / 100e9);
  EXPECT_EQ(ddp.exposed_seconds, ddp.seconds) << "no compute time given: nothing hidden";
  EXPECT_NE(error_of([] { transfer_seconds(1e9, 0); }).find("bus bandwidth"), std::string::npos);
  CommunicationInput no_link = billion_on_eight(0);
  no_link.busbw_gb_per_s = 0;
  EXPECT_NE(error_of([&] { estimate_communication(no_link); }).find("8 ranks need a positive bus bandwidth"),
            std::string::npos);
}

TEST(Communication, HiddenShareIsBetweenNothingAndTheWholeReduction) {
  // A link that keeps up shows only the last bucket: t = 10, c = 20, k = 4: max(10 - 15, 2.5) = 2.5.
  EXPECT_DOUBLE_EQ(exposed_seconds(10, 20, 4), 2.5);
  // One that does not is busy from c/k = 1 to 11: t = 10, c = 4, k = 4: max(10 - 3, 2.5) = 7.
  EXPECT_DOUBLE_EQ(exposed_seconds(10, 4, 4), 7);
  EXPECT_DOUBLE_EQ(exposed_seconds(10, 0, 4), 10);   // no compute: all exposed
  EXPECT_DOUBLE_EQ(exposed_seconds(10, 100, 1), 10);  // one bucket: it is the last
  for (const double t : {0.0, 1e-3, 0.5, 2.0, 50.0})
    for (const double c : {0.0, 1e-3, 0.5, 2.0, 50.0})
      for (const int64_t k : {1, 2, 3, 8, 1000}) {
        const double exposed = exposed_seconds(t, c, k), hidden = t - exposed;
        EXPECT_GE(hidden, 0.0) << t << " " << c << " " << k;
        EXPECT_LE(hidden, t) << t << " " << c << " " << k;
        EXPECT_GE(exposed, t / static_cast<double>(k) - 1e-15) << "the last bucket always shows";
      }
  // Through estimate_communication: the hidden share stays within [0, 1] and overlap off hides nothing.
  CommunicationInput in = billion_on_eight(0);
  in.buckets = 4;
  in.forward_seconds = 0.05;
  in.backward_seconds = 0.1;  // 35 ms of all-reduce, 100 ms of backward: 35/4 = 8.75 ms shows
  const CommunicationEstimate overlapped = estimate_communication(in);
  EXPECT_DOUBLE_EQ(overlapped.exposed_seconds, 0.00875);
  EXPECT_DOUBLE_EQ(overlapped.hidden_share(), 0.75);
  in.overlap_grad_reduce = false;
  const CommunicationEstimate after = estimate_communication(in);
  EXPECT_DOUBLE_EQ(after.exposed_seconds, after.seconds);
  EXPECT_EQ(after.hidden_share(), 0.0);
  // ZeRO-1: the reduce-scatter (17.5 ms) hides to a quarter; the gather (17.5 ms) follows the step,
  // exposed, unless it overlaps the next forward (50 ms): then its first bucket shows.
  in = billion_on_eight(1);
  in.buckets = 4;
  in.forward_seconds = 0.05;
  in.backward_seconds = 0.1;
  EXPECT_DOUBLE_EQ(estimate_communication(in).exposed_seconds, 0.0175 / 4 + 0.0175);
  in.overlap_param_gather = true;
  EXPECT_DOUBLE_EQ(estimate_communication(in).exposed_seconds, 0.0175 / 4 + 0.0175 / 4);
}

TEST(Communication, NamedLinksResolveAndAnUnknownOneIsNamed) {
  EXPECT_DOUBLE_EQ(find_link("nvlink4").busbw_gb_per_s, 360.0);
  EXPECT_DOUBLE_EQ(find_link("pcie4").busbw_gb_per_s, 25.0);
  EXPECT_DOUBLE_EQ(find_link("pcie5").busbw_gb_per_s, 50.0);
  EXPECT_DOUBLE_EQ(find_link("efa400").busbw_gb_per_s, 50.0);    // 400 Gb/s / 8
  EXPECT_DOUBLE_EQ(find_link("efa3200").busbw_gb_per_s, 400.0);  // 3200 Gb/s / 8
  EXPECT_DOUBLE_EQ(find_link("eth100").busbw_gb_per_s, 12.5);    // 100 Gb/s / 8
  const std::string error = error_of([] { find_link("infiniband400", "--inter-node-link"); });
  EXPECT_NE(error.find("--inter-node-link 'infiniband400' is not a link kiln knows"), std::string::npos) << error;
  EXPECT_NE(error.find("efa3200"), std::string::npos) << "lists the known ones: " << error;
}

TEST(Communication, BucketCountIsWhatGradientBucketsCuts) {
  // The layout of tests/dist/gradient_buckets_test.cpp: [60, 100), [30, 60), [0, 30).
  const std::vector<int64_t> starts{0, 10, 30, 35, 60, 90};
  std::vector<float> grads(100);
  SingleProcessCommunicator communicator;
  for (const int64_t elements : {1, 5, 26, 40, 70, 100, 1000}) {
    const GradientBuckets buckets(communicator, Tensor{grads.data(), Shape{100}}, starts, elements);
    EXPECT_EQ(gradient_bucket_count(starts, 100, elements), static_cast<int64_t>(buckets.buckets().size()))
        << elements;
  }
  EXPECT_EQ(gradient_bucket_count(starts, 100, 26), 3);
}

ScalingInput slow_network(int stage) {
  ScalingInput in;
  in.communication = billion_on_eight(stage);
  in.communication.buckets = 4;
  in.nodes = 8;
  in.gpus_per_node = 8;
  in.intra_node_busbw = 360;  // nvlink4
  in.inter_node_busbw = 12.5;  // eth100
  in.seconds_per_iteration = 0.3;
  in.samples_per_gpu = 8;
  in.micro_batch = 8;
  in.seq_length = 1024;
  return in;
}

TEST(Communication, ScalingEfficiencyIsOneAtOneGpuAndFallsAcrossASlowNetwork) {
  const std::vector<ScalingRow> rows = scaling_table(slow_network(0));
  ASSERT_EQ(rows.size(), 5u);  // 1 GPU, then 1, 2, 4, 8 nodes
  EXPECT_EQ(rows[0].gpus, 1);
  EXPECT_EQ(rows[0].efficiency, 1.0);
  EXPECT_EQ(rows[0].exposed_seconds, 0.0);
  EXPECT_DOUBLE_EQ(rows[0].tokens_per_second, 8 * 1024 / 0.3);
  EXPECT_EQ(rows[1].gpus, 8);
  EXPECT_EQ(rows[1].busbw_gb_per_s, 360);    // one node: NVLink
  EXPECT_EQ(rows[2].busbw_gb_per_s, 12.5);   // across nodes: each node's network
  EXPECT_GT(rows[1].efficiency, 0.95);       // 35 x 7/8 x 100/360... hidden behind 200 ms of backward
  for (size_t i = 2; i < rows.size(); ++i) {
    EXPECT_LT(rows[i].efficiency, rows[i - 1].efficiency) << rows[i].nodes << " nodes";
    EXPECT_DOUBLE_EQ(rows[i].step_seconds, rows[i].compute_seconds + rows[i].exposed_seconds);
    EXPECT_DOUBLE_EQ(rows[i].efficiency, rows[0].step_seconds / rows[i].step_seconds) << "weak scaling";
  }
  // 64 GPUs over 12.5 GB/s: 2 x 2e9 x 63/64 / 12.5e9 = 315 ms against 200 ms of backward in 4 buckets:
  // max(315 - 150, 78.75) = 165 ms exposed, a 465 ms step: 0.3 / 0.465 = 64.5%.
  EXPECT_NEAR(rows[4].exposed_seconds, 0.165, 1e-12);
  EXPECT_NEAR(rows[4].efficiency, 0.3 / 0.465, 1e-12);
}

TEST(Communication, StrongScalingSplitsTheGlobalBatch) {
  ScalingInput in = slow_network(0);
  in.inter_node_busbw = 400;  // efa3200
  in.global_batch = 512;      // 512 samples at 1 GPU (64 micro-batches), 8 per GPU at 64
  const std::vector<ScalingRow> rows = scaling_table(in);
  EXPECT_DOUBLE_EQ(rows[0].samples_per_gpu, 512);
  EXPECT_EQ(rows[0].micro_batches, 64);
  EXPECT_DOUBLE_EQ(rows[0].compute_seconds, 0.3 * 64);
  EXPECT_DOUBLE_EQ(rows.back().samples_per_gpu, 8);
  EXPECT_DOUBLE_EQ(rows.back().compute_seconds, 0.3);
  EXPECT_EQ(rows[0].efficiency, 1.0);
  for (const ScalingRow& row : rows) EXPECT_LE(row.efficiency, 1.0);
}

TEST(Communication, ScalingNeedsTheLinksItUses) {
  ScalingInput in = slow_network(0);
  in.inter_node_busbw.reset();
  EXPECT_NE(error_of([&] { scaling_table(in); }).find("give --inter-node-link"), std::string::npos);
  in = slow_network(0);
  in.nodes = 1;
  in.inter_node_busbw.reset();
  EXPECT_EQ(scaling_table(in).size(), 2u) << "one node needs no network";
  in.intra_node_busbw.reset();
  EXPECT_NE(error_of([&] { scaling_table(in); }).find("give --link"), std::string::npos);
}

TEST(Communication, ReportFromTheEstimate) {
  // The small GPT (2 layers, 64 wide, vocabulary 128 padded to 192) on 2 GPUs, 2 samples each.
  EstimateInput in = testing::small_estimate_input();
  in.gpus = 2;
  in.micro_batch_size = 2;
  in.tflops_per_gpu.reset();
  const Estimate e = estimate(in);
  CommunicationOptions options;
  options.intra_node_busbw = 100;
  const CommunicationReport r = communication_report(in, e, options);
  EXPECT_TRUE(r.compute_from_roofline);
  EXPECT_DOUBLE_EQ(r.compute_seconds, e.roofline.ms * 1e-3);
  EXPECT_NEAR(r.forward_share, 1.0 / 3, 1e-12);  // no recomputation: the 72 form is 3 forwards
  EXPECT_EQ(r.buckets, 1) << "40 M elements a bucket: the whole small model";
  EXPECT_EQ(r.micro_batches, 1);
  // fp32 gradients all-reduced over 2 ranks: 2 x 1/2 x 4 bytes a parameter.
  EXPECT_DOUBLE_EQ(r.stages[0].bytes_per_rank, 4.0 * static_cast<double>(e.parameters_exact));
  // ZeRO-3 gathers bf16 weights twice and reduce-scatters fp32 gradients: (2 + 2 + 4) / 2 bytes.
  EXPECT_DOUBLE_EQ(r.stages[3].bytes_per_rank, 4.0 * static_cast<double>(e.parameters_exact));
  EXPECT_DOUBLE_EQ(r.memory_bytes[0], e.memory.total());
  EXPECT_LT(r.memory_bytes[3], r.memory_bytes[2]);
  EXPECT_LT(r.memory_bytes[2], r.memory_bytes[1]);
  ASSERT_EQ(r.scaling.size(), 2u);  // 1 GPU and the one node of 8
  EXPECT_EQ(r.scaling[1].gpus, 8);
  CommunicationOptions crowded = options;
  crowded.nodes = 1;
  crowded.gpus_per_node = 1;
  EXPECT_NE(error_of([&] { communication_report(in, e, crowded); })
                .find("--gpus 2 do not fit on --nodes 1 x --gpus-per-node 1"),
            std::string::npos);
}

// The encoder classifier's report counts its own parameters and cuts its own layout into buckets.
TEST(Communication, EncoderClassifierReportCountsItsOwnParameters) {
  EstimateInput in = testing::small_estimate_input();  // 2 layers, 64 wide, vocabulary 128
  in.model = "encoder-classifier";
  in.num_labels = 3;
  in.gpus = 2;
  in.micro_batch_size = 2;
  in.tflops_per_gpu.reset();
  const Estimate e = estimate(in);
  EXPECT_EQ(e.parameters_exact, 127299);  // tests/perf/encoder_estimate_test.cpp works it out
  CommunicationOptions options;
  options.intra_node_busbw = 100;
  options.ddp_bucket_size = 70000;
  const CommunicationReport r = communication_report(in, e, options);
  // fp32 gradients all-reduced over 2 ranks: 2 x 1/2 x 4 bytes a parameter.
  EXPECT_DOUBLE_EQ(r.stages[0].bytes_per_rank, 4.0 * 127299);
  // From the end: the head, pooler, final LayerNorm and intermediate layers (16,963 elements), the
  // last block (49,984) and the first block's MLP projection (16,448) close a bucket of >= 70,000;
  // the rest, down to the embeddings at the buffer's start, is the second.
  EXPECT_EQ(r.buckets, 2);
  const ParameterLayout layout = encoder_parameter_layout(encoder_config(training_config(in)));
  std::vector<int64_t> starts;
  for (const ParameterInfo& entry : layout.entries()) starts.push_back(entry.offset);
  EXPECT_EQ(r.buckets, gradient_bucket_count(starts, 127299, 70000));
}

TEST(Communication, EstimateCommThroughTheBinary) {
  const std::string gpt2 = "estimate comm --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 "
                           "--vocab-size 50257 --global-batch-size 512 --micro-batch-size 64 --gpus 8 "
                           "--precision bf16 --tflops-per-gpu 400";
  const testing::CommandResult json =
      testing::run_kiln(gpt2 + " --link nvlink4 --inter-node-link efa3200 --nodes 4 --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto out = nlohmann::json::parse(json.output);
  const auto& stages = out["communication"]["stages"];
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_EQ(stages[0]["psi"].get<double>(), 2.0);
  EXPECT_EQ(stages[3]["psi"].get<double>(), 3.0);
  EXPECT_EQ(out["communication"]["busbw_gb_per_s"].get<double>(), 360.0);
  const auto& rows = out["scaling"]["rows"];
  ASSERT_EQ(rows.size(), 4u);  // 1 GPU, 1, 2, 4 nodes
  EXPECT_EQ(rows[0]["efficiency"].get<double>(), 1.0);
  EXPECT_EQ(rows[3]["gpus"].get<int>(), 32);
  EXPECT_EQ(rows[3]["busbw_gb_per_s"].get<double>(), 360.0) << "min(NVLink 360, EFA 400)";

  const testing::CommandResult table = testing::run_kiln(gpt2 + " --busbw 100 --inter-node-busbw 12.5 --nodes 2");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  for (const char* text : {"# kiln estimate comm", "ZeRO-3", "<- --zero-stage", "efficiency", "--busbw 100 GB/s"})
    EXPECT_NE(table.output.find(text), std::string::npos) << text << "\n" << table.output;

  const testing::CommandResult unknown = testing::run_kiln(gpt2 + " --link nvlink9");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("kiln: error: --link 'nvlink9' is not a link kiln knows"), std::string::npos)
      << unknown.output;
  const testing::CommandResult both = testing::run_kiln(gpt2 + " --link nvlink4 --busbw 100");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.output.find("give one of --link (a named link) and --busbw (GB/s), not both"), std::string::npos)
      << both.output;
  const testing::CommandResult missing = testing::run_kiln(gpt2);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("give --link"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace kiln
