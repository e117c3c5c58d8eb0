// The estimate a run records at its start (obs/run_report_prediction.h): kiln estimate's numbers
// for the run's config on its device, the roofline kiln train states on a GPU, no time on the CPU,
// the estimator's reason where it refuses, and a JSON form that reads back or names what is wrong.
#include "kiln/obs/run_report_prediction.h"

#include <gtest/gtest.h>

#include "kiln/perf/estimator.h"
#include "kiln/perf/roofline.h"
#include "support/error_of.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

using testing::error_of;

// Two data-parallel ranks of the tiny bf16 GPT (support/small_gpt.h), two micro-batches each.
Config two_rank_config() {
  Config config = testing::tiny_mock_gpt_config("cpu");
  config.global_batch_size = 8;
  config.bf16 = true;
  config.resolve(2);
  return config;
}

EstimateInput estimate_input_of_two_rank_config(const std::string& gpu) {
  EstimateInput in;
  in.num_layers = 2;
  in.hidden_size = 32;
  in.num_attention_heads = 2;
  in.seq_length = 16;
  in.vocab_size = 67;
  in.global_batch_size = 8;
  in.micro_batch_size = 2;
  in.gpus = 2;
  in.gpu = gpu;
  in.precision = "bf16";
  return in;
}

TEST(RunPrediction, IsKilnEstimatesForTheConfigOnItsGpu) {
  const Config config = two_rank_config();
  const RunPrediction prediction = predict_run(config, "NVIDIA H100 80GB HBM3");
  const Estimate expected = estimate(estimate_input_of_two_rank_config("h100-sxm"));
  EXPECT_EQ(prediction.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(prediction.gpu, "h100-sxm");
  EXPECT_EQ(prediction.parameters, expected.parameters_exact);
  EXPECT_EQ(prediction.flops_per_iteration, expected.flops_per_iteration);
  EXPECT_EQ(prediction.memory_bytes_per_gpu, expected.memory.total());
  EXPECT_EQ(prediction.tokens_per_iteration, 8 * 16);
  EXPECT_EQ(prediction.data_parallel_size, 2);
  // The roofline kiln train states on that GPU, and the tokens/s of both ranks at it.
  const double train_states_ms =
      roofline(count_iteration_ops(iteration_shape(config)), datasheet_limits(*find_gpu_by_key("h100-sxm"), "bf16")).ms;
  ASSERT_TRUE(prediction.seconds_per_iteration && prediction.tokens_per_second);
  EXPECT_DOUBLE_EQ(*prediction.seconds_per_iteration, train_states_ms * 1e-3);
  EXPECT_DOUBLE_EQ(*prediction.tokens_per_second, 8 * 16 / (train_states_ms * 1e-3));
  EXPECT_EQ(prediction.no_time_because, "");
  EXPECT_EQ(prediction.unavailable, "");
}

TEST(RunPrediction, OnTheCpuHasNoTimeAndSaysWhy) {
  const RunPrediction prediction = predict_run(two_rank_config(), "cpu, 2 threads");
  const Estimate expected = estimate(estimate_input_of_two_rank_config("h100-sxm"));  // the GPU does not matter
  EXPECT_EQ(prediction.gpu, "");
  EXPECT_EQ(prediction.parameters, expected.parameters_exact);
  EXPECT_EQ(prediction.memory_bytes_per_gpu, expected.memory.total());
  EXPECT_FALSE(prediction.seconds_per_iteration);
  EXPECT_FALSE(prediction.tokens_per_second);
  EXPECT_EQ(prediction.no_time_because,
            "kiln estimate times the GPUs of its datasheet table (kiln estimate --gpu) alone, not 'cpu, 2 threads'");
}

TEST(RunPrediction, AConfigTheEstimatorRefusesRecordsItsReason) {
  const RunPrediction prediction = predict_run(two_rank_config(), "Tesla V100-SXM2-32GB");  // no bf16 tensor cores
  EXPECT_EQ(prediction.unavailable, "--gpu v100 has no bf16 tensor cores");
  EXPECT_EQ(prediction.parameters, 0);
  EXPECT_EQ(prediction.tokens_per_iteration, 8 * 16);
  const RunPrediction read = prediction_from_json(to_json(prediction), "test");
  EXPECT_EQ(read.unavailable, prediction.unavailable);
}

TEST(RunPrediction, JsonReadsBackAndBadJsonNamesTheSourceAndKey) {
  for (const char* device : {"NVIDIA H100 80GB HBM3", "cpu, 2 threads"}) {
    const RunPrediction written = predict_run(two_rank_config(), device);
    const RunPrediction read = prediction_from_json(to_json(written), "test");
    EXPECT_EQ(read.device, written.device);
    EXPECT_EQ(read.gpu, written.gpu);
    EXPECT_EQ(read.parameters, written.parameters);
    EXPECT_EQ(read.flops_per_iteration, written.flops_per_iteration);
    EXPECT_EQ(read.tokens_per_iteration, written.tokens_per_iteration);
    EXPECT_EQ(read.data_parallel_size, written.data_parallel_size);
    EXPECT_EQ(read.memory_bytes_per_gpu, written.memory_bytes_per_gpu);
    EXPECT_EQ(read.seconds_per_iteration, written.seconds_per_iteration);
    EXPECT_EQ(read.tokens_per_second, written.tokens_per_second);
    EXPECT_EQ(read.no_time_because, written.no_time_because);
  }
  const std::string good = R"("device": "cpu", "gpu": "", "parameters": 10, "flops_per_iteration": 1e6, )"
                           R"("tokens_per_iteration": 64, "data_parallel_size": 1)";
  EXPECT_EQ(error_of([] { prediction_from_json("parameters: 3", "the estimate"); }),
            "the estimate: not a JSON object: 'parameters: 3'");
  EXPECT_EQ(error_of([&] { prediction_from_json("{" + good + "}", "the estimate"); }),
            "the estimate: 'memory_bytes_per_gpu' is missing");
  EXPECT_EQ(error_of([&] { prediction_from_json("{" + good + R"(, "memory_bytes_per_gpu": -1})", "the estimate"); }),
            "the estimate: 'memory_bytes_per_gpu' is -1, not a number >= 0");
  EXPECT_EQ(
      error_of([&] { prediction_from_json("{" + good + R"(, "memory_bytes_per_gpu": 1, "unavailable": 3})", "e"); }),
      "e: 'unavailable' is 3, not a string");
}

}  // namespace
}  // namespace kiln
