// The NCCL communicator in a group of one rank, the only group one GPU allows (NCCL refuses two
// ranks on one GPU): every operation on GPU memory, and the Trainer in such a group against the
// same run in a process alone. On a GPU machine this is real NCCL; in CI the suite runs on the CPU
// emulator against its one-rank NCCL stand-in (tests/cuda_emulator/nccl_stand_in.cpp); without
// either it skips with the reason. Groups of several GPUs are not tested here: only one is lent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/core/dtype.h"
#include "kiln/train/trainer.h"
#include "support/backends.h"
#include "support/error_of.h"
#include "support/nccl_group.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;

class CudaNcclCommunicator : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = testing::backend_skip_reason("cuda");
    if (!reason.empty()) GTEST_SKIP() << reason;
    gpu_ = make_backend("cuda");
  }
  // `values` in GPU memory, kept alive by the fixture.
  Tensor on_gpu(const std::vector<float>& values) {
    buffers_.push_back(gpu_->allocate(values.size() * sizeof(float)));
    gpu_->copy_to_device(buffers_.back()->data(), values.data(), values.size() * sizeof(float));
    return {buffers_.back()->data(), Shape{static_cast<int64_t>(values.size())}, DType::F32, Device::CUDA};
  }
  std::vector<float> on_host(const Tensor& tensor) {
    std::vector<float> values(static_cast<size_t>(tensor.numel()));
    gpu_->copy_to_host(values.data(), tensor.data, tensor.bytes());
    return values;
  }

  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

TEST_F(CudaNcclCommunicator, EveryOperationOfOneRankLeavesItsBuffer) {
  const auto group = testing::join_alone_over_nccl();
  Communicator& nccl = *group->communicator;
  EXPECT_EQ(nccl.name(), "nccl");
  EXPECT_EQ(nccl.world_size(), 1);
  EXPECT_EQ(nccl.rank(), 0);
  std::vector<float> values(1001);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;
  // Written by a copy queued on the compute stream just before each operation: the operation must
  // come after it (the emulator runs the copy only when something waits for it).
  const Tensor data = on_gpu(values);
  nccl.all_reduce(data, ReduceOp::Sum)->wait();
  EXPECT_EQ(on_host(data), values);
  nccl.all_reduce(data, ReduceOp::Max)->wait();
  EXPECT_EQ(on_host(data), values);
  nccl.reduce_scatter(data)->wait();
  EXPECT_EQ(on_host(data), values);
  nccl.reduce(data, 0)->wait();
  EXPECT_EQ(on_host(data), values);
  nccl.all_gather(data)->wait();
  EXPECT_EQ(on_host(data), values);
  nccl.broadcast(data, 0)->wait();
  EXPECT_EQ(on_host(data), values);
  // Several in flight, waited for in reverse: each completes; waiting twice is allowed.
  auto first = nccl.all_reduce(data.slice(0, 500), ReduceOp::Sum);
  auto second = nccl.all_reduce(data.slice(500, 501), ReduceOp::Sum);
  second->wait();
  first->wait();
  first->wait();
  EXPECT_EQ(on_host(data), values);

  // Host scalars, more than the communicator's scalar buffer holds at once.
  std::vector<double> scalars(5000);
  for (size_t i = 0; i < scalars.size(); ++i) scalars[i] = 1.0 / static_cast<double>(i + 1);
  const std::vector<double> expected = scalars;
  nccl.all_reduce_host(scalars, ReduceOp::Sum);
  EXPECT_EQ(scalars, expected);
  nccl.barrier();
}

TEST_F(CudaNcclCommunicator, HostMemoryAndUnequalShardsAreRefusedByName) {
  const auto group = testing::join_alone_over_nccl();
  std::vector<float> host(8, 1.0f);
  const Tensor in_host{host.data(), Shape{8}, DType::F32, Device::CPU};
  EXPECT_NE(testing::error_of([&] { group->communicator->all_reduce(in_host, ReduceOp::Sum); })
                .find("nccl all_reduce: the buffer is in host memory"),
            std::string::npos);
  const Tensor bf16{on_gpu(host).data, Shape{8}, DType::BF16, Device::CUDA};
  EXPECT_NE(testing::error_of([&] { group->communicator->all_reduce(bf16, ReduceOp::Sum); })
                .find("fp32 buffers only, got bf16"),
            std::string::npos);
}

Config tiny_gpt_on_cuda(bool zero1) {
  Config config = testing::tiny_mock_gpt_config("cuda");
  config.global_batch_size = 4;  // two micro-batches: the buckets reduce the accumulated sum
  config.train_iters = 3;
  config.use_distributed_optimizer = zero1;
  config.ddp_bucket_size = 2000;  // several buckets, started during the last backward
  return config;
}

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  std::vector<float> parameters;
};

TrainedRun train(const Config& config, Communicator* communicator) {
  Trainer trainer(config, communicator);
  TrainedRun run;
  for (int i = 0; i < config.train_iters; ++i) {
    const IterationStats stats = trainer.train_step();
    run.losses.push_back(stats.lm_loss);
    run.grad_norms.push_back(stats.grad_norm);
  }
  const Tensor params = trainer.model().params();
  run.parameters.resize(static_cast<size_t>(params.numel()));
  trainer.backend().copy_to_host(run.parameters.data(), params.data, params.bytes());
  return run;
}

class CudaNcclTrainer : public ::testing::TestWithParam<bool> {};

// The data-parallel path (buckets, or ZeRO-1's reduce-scatter and all-gather) over NCCL with one
// rank sums nothing, so it must give the very bits of the process alone.
TEST_P(CudaNcclTrainer, OneRankOverNcclEqualsTheProcessAlone) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  const Config config = tiny_gpt_on_cuda(GetParam());
  const TrainedRun alone = train(config, nullptr);
  const auto group = testing::join_alone_over_nccl();
  const TrainedRun grouped = train(config, group->communicator.get());
  EXPECT_EQ(grouped.losses, alone.losses);
  EXPECT_EQ(grouped.grad_norms, alone.grad_norms);
  EXPECT_TRUE(grouped.parameters == alone.parameters);
  EXPECT_LT(alone.losses.back(), alone.losses.front());
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaNcclTrainer, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "zero1" : "buckets"; });

}  // namespace
}  // namespace kiln
