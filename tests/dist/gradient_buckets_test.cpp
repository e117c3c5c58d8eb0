// GradientBuckets: bucket boundaries, when each bucket starts, and that a step waits for all.
#include "kiln/dist/gradient_buckets.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "kiln/nn/gpt.h"
#include "kiln/backend/registry.h"
#include "support/error_of.h"

namespace kiln {
namespace {

// Records the ranges it is asked to reduce, and which of them have been waited for.
class RecordingCommunicator final : public Communicator {
 public:
  struct Call {
    int64_t begin, count;
    int root = -1;  // -1: every rank (an all-reduce)
    bool waited = false;
  };
  explicit RecordingCommunicator(const float* base) : base_(base) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string name() const override { return "recording"; }
  std::unique_ptr<CommWork> all_reduce(Tensor data, ReduceOp) override {
    calls.push_back({data.as<float>() - base_, data.numel()});
    return std::make_unique<Work>(calls, calls.size() - 1);
  }
  std::unique_ptr<CommWork> reduce(Tensor data, int root) override {
    calls.push_back({data.as<float>() - base_, data.numel(), root});
    return std::make_unique<Work>(calls, calls.size() - 1);
  }
  std::unique_ptr<CommWork> reduce_scatter(Tensor) override { return nullptr; }
  std::unique_ptr<CommWork> all_gather(Tensor) override { return nullptr; }
  std::unique_ptr<CommWork> broadcast(Tensor, int) override { return nullptr; }
  void barrier() override {}
  void all_reduce_host(std::span<double>, ReduceOp) override {}
  std::vector<Call> calls;

 private:
  struct Work final : CommWork {
    Work(std::vector<Call>& calls, size_t index) : calls(calls), index(index) {}
    void wait() override { calls[index].waited = true; }
    std::vector<Call>& calls;
    size_t index;
  };
  const float* base_;
};

TEST(GradientBuckets, CutAtParameterBoundariesFromTheEndOfTheBuffer) {
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  const std::vector<int64_t> starts{0, 10, 30, 35, 60, 90};
  GradientBuckets buckets(comm, Tensor{grads.data(), Shape{100}}, starts, 26);
  // From the end: [60, 100) reaches 26 at 60; [30, 60) at 30; [0, 30) is what is left.
  ASSERT_EQ(buckets.buckets().size(), 3u);
  EXPECT_EQ(buckets.buckets()[0].begin, 60);
  EXPECT_EQ(buckets.buckets()[0].end, 100);
  EXPECT_EQ(buckets.buckets()[1].begin, 30);
  EXPECT_EQ(buckets.buckets()[1].end, 60);
  EXPECT_EQ(buckets.buckets()[2].begin, 0);
  EXPECT_EQ(buckets.buckets()[2].end, 30);
  EXPECT_NE(testing::error_of([&] { GradientBuckets(comm, Tensor{grads.data(), Shape{100}}, starts, 0); })
                .find("'ddp_bucket_size' must be positive"),
            std::string::npos);
}

TEST(GradientBuckets, EachBucketStartsOnceItsRangeIsFinalAndTheStepWaitsForAll) {
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(comm, Tensor{grads.data(), Shape{100}}, std::vector<int64_t>{0, 10, 30, 35, 60, 90}, 26);
  buckets.gradients_final_from(90);  // [90, 100) alone is inside no bucket yet
  EXPECT_TRUE(comm.calls.empty());
  buckets.gradients_final_from(60);
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].begin, 60);
  EXPECT_EQ(comm.calls[0].count, 40);
  EXPECT_FALSE(comm.calls[0].waited);  // started, not waited for: the backward goes on
  buckets.gradients_final_from(35);
  EXPECT_EQ(comm.calls.size(), 1u);
  buckets.finish();  // starts [30, 60) and [0, 30), waits for all three
  ASSERT_EQ(comm.calls.size(), 3u);
  for (const auto& call : comm.calls) EXPECT_TRUE(call.waited);
  EXPECT_EQ(buckets.started_during_backward(), 1);
  // The next step starts over from the top bucket.
  buckets.gradients_final_from(0);
  EXPECT_EQ(comm.calls.size(), 6u);
  EXPECT_EQ(comm.calls[3].begin, 60);
  buckets.finish();
  EXPECT_EQ(buckets.started_during_backward(), 3);
}

TEST(GradientBuckets, ForTheShardsOwnersEachBucketIsCutAtTheShardsAndReducedToTheirOwners) {
  // Two ranks own [0, 50) and [50, 100); the bucket [30, 60) crosses the boundary.
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  GradientBuckets buckets(comm, Tensor{grads.data(), Shape{100}}, std::vector<int64_t>{0, 10, 30, 35, 60, 90}, 26, 0,
                          50);
  buckets.gradients_final_from(30);
  ASSERT_EQ(comm.calls.size(), 3u);
  const std::vector<std::tuple<int64_t, int64_t, int>> expected{{60, 40, 1}, {30, 20, 0}, {50, 10, 1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(comm.calls[i].begin, std::get<0>(expected[i])) << i;
    EXPECT_EQ(comm.calls[i].count, std::get<1>(expected[i])) << i;
    EXPECT_EQ(comm.calls[i].root, std::get<2>(expected[i])) << i;
  }
  buckets.finish();
  ASSERT_EQ(comm.calls.size(), 4u);
  EXPECT_EQ(comm.calls[3].begin, 0);
  EXPECT_EQ(comm.calls[3].count, 30);
  EXPECT_EQ(comm.calls[3].root, 0);
  for (const auto& call : comm.calls) EXPECT_TRUE(call.waited);
  EXPECT_NE(testing::error_of([&] {
              GradientBuckets(comm, Tensor{grads.data(), Shape{100}}, std::vector<int64_t>{0, 10}, 26, 0, 40);
            }).find("2 ranks' shards of 40 elements do not make the buffer's 100"),
            std::string::npos);
}

TEST(GradientBuckets, TheGptBackwardFinishesItsGradientsFromTheEndOfTheBufferDown) {
  // The watermark contract the buckets rely on: non-increasing, ending at 0; ln_f, then within
  // each block each product's weights and each LayerNorm's as its backward is issued (six a
  // block), then the embeddings.
  auto backend = make_backend("cpu");
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 16;
  config.num_heads = 2;
  config.vocab_size = 32;
  config.max_position_embeddings = 8;
  Gpt model(config, *backend);
  model.init_weights(1);
  model.allocate_activations(2, 8);
  std::vector<int64_t> marks;
  model.set_gradients_final_listener([&](int64_t first) { marks.push_back(first); });
  std::vector<int32_t> tokens(16, 3), targets(16, 4);
  model.forward(tokens, targets, 2, 8, GradientPass::Write);
  model.backward();
  const ParameterLayout& layout = model.layout();
  std::vector<int64_t> expected{layout.find("ln_f.weight").offset};
  for (const int layer : {2, 1, 0})
    for (const char* parameter : {"mlp.c_proj.weight", "mlp.c_fc.weight", "ln_2.weight", "attn.c_proj.weight",
                                  "attn.c_attn.weight", "ln_1.weight"})
      expected.push_back(layout.find(fmt::format("h.{}.{}", layer, parameter)).offset);
  expected.push_back(0);
  EXPECT_EQ(marks, expected);
}

TEST(GradientBuckets, TheEarlyBucketStartsOutOfOrderOnceAndTheWatermarkStopsAboveIt) {
  std::vector<float> grads(100);
  RecordingCommunicator comm(grads.data());
  const std::vector<int64_t> starts{0, 10, 30, 35, 60, 90};
  // [0, 30): the early bucket; above it, the usual cut from the end.
  GradientBuckets buckets(comm, Tensor{grads.data(), Shape{100}}, starts, 26, 30);
  ASSERT_EQ(buckets.buckets().size(), 3u);
  EXPECT_EQ(buckets.buckets()[1].begin, 30);
  EXPECT_EQ(buckets.buckets()[2].begin, 0);
  EXPECT_EQ(buckets.buckets()[2].end, 30);
  buckets.start_early();
  buckets.start_early();  // once a step
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].begin, 0);
  EXPECT_EQ(comm.calls[0].count, 30);
  buckets.gradients_final_from(30);  // every bucket above the early one
  ASSERT_EQ(comm.calls.size(), 3u);
  buckets.finish();  // nothing left to start
  EXPECT_EQ(comm.calls.size(), 3u);
  EXPECT_EQ(buckets.started_during_backward(), 3);
  // Without an early start (no overlap), finish() starts the early bucket last, in order.
  buckets.finish();
  ASSERT_EQ(comm.calls.size(), 6u);
  EXPECT_EQ(comm.calls[5].begin, 0);
  // Its end must be a parameter boundary.
  EXPECT_NE(testing::error_of([&] { GradientBuckets(comm, Tensor{grads.data(), Shape{100}}, starts, 26, 31); })
                .find("the early bucket must end at a parameter start, not at 31"),
            std::string::npos);
}

TEST(GradientBuckets, ADeferredLookupLeavesTheEmbeddingFinalBeforeTheBlocksAndAddsLater) {
  // Gpt::defer_embedding_lookup: the backward leaves the lookup out and reports nothing below the
  // first block; adding the lookup afterwards gives the gradients of the whole backward.
  auto backend = make_backend("cpu");
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_heads = 2;
  config.vocab_size = 32;
  config.max_position_embeddings = 8;
  std::vector<int32_t> tokens(16), targets(16);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i * 7 % 32);
    targets[i] = static_cast<int32_t>(i * 5 % 32);
  }
  const auto gradients = [&](bool defer) {
    Gpt model(config, *backend);
    model.init_weights(1);
    model.allocate_activations(2, 8);
    std::vector<int64_t> marks;
    model.set_gradients_final_listener([&](int64_t first) { marks.push_back(first); });
    for (const GradientPass pass : {GradientPass::Write, GradientPass::Add}) {
      model.forward(tokens, targets, 2, 8, pass);
      if (defer) model.defer_embedding_lookup();
      model.backward();
      if (defer) {
        const Tensor tokens_tensor{tokens.data(), Shape{2, 8}, DType::I32, Device::CPU};
        model.add_embedding_lookup(model.embedding_output_gradient(), tokens_tensor);
      }
    }
    if (defer) {
      EXPECT_EQ(marks.back(), model.layout().find("h.0.ln_1.weight").offset);
    }
    const Tensor grads = model.grads();
    return std::vector<float>(grads.as<float>(), grads.as<float>() + grads.numel());
  };
  EXPECT_TRUE(gradients(true) == gradients(false));
}

}  // namespace
}  // namespace kiln
