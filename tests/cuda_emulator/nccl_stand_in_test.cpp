// The NCCL communicator's fault handling, on the emulator, whose NCCL stand-in can play a rank that
// never connects, a peer that dies and a peer that hangs (nccl_stand_in.cpp): each ends in an
// error naming the operation within the timeout, with the communicator aborted, and nothing
// hangs. Also that the Trainer's gradients really go through the communicator in a group of one.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/train/trainer.h"
#include "nccl_stand_in.h"
#include "support/error_of.h"
#include "support/nccl_group.h"
#include "support/small_gpt.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Sets KILN_NCCL_STAND_IN_FAULT for the communicators created during its life.
class Fault {
 public:
  explicit Fault(const char* kind) { ::setenv("KILN_NCCL_STAND_IN_FAULT", kind, 1); }
  ~Fault() { ::unsetenv("KILN_NCCL_STAND_IN_FAULT"); }
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(EmulatedNccl, ARankThatNeverConnectsEndsTheJoinAtTheTimeout) {
  const Fault fault("init-hang");
  const int64_t aborts = nccl_stand_in::calls().aborts;
  const auto start = Clock::now();
  const std::string error = testing::error_of([] { testing::join_alone_over_nccl(300ms); });
  EXPECT_NE(error.find("nccl connecting (GPU 0) on rank 0 of 1 failed"), std::string::npos) << error;
  EXPECT_NE(error.find("still in progress after 0.005 min (--distributed-timeout-minutes)"), std::string::npos)
      << error;
  EXPECT_NE(error.find("the communicator was aborted"), std::string::npos) << error;
  EXPECT_EQ(nccl_stand_in::calls().aborts, aborts + 1);
  EXPECT_LT(seconds_since(start), 10.0);
}

class EmulatedNcclFault : public ::testing::Test {
 protected:
  void SetUp() override { gpu_ = make_backend("cuda"); }
  Tensor gpu_buffer(int64_t count) {
    buffer_ = gpu_->allocate(static_cast<size_t>(count) * sizeof(float));
    return {buffer_->data(), Shape{count}, DType::F32, Device::CUDA};
  }
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<DeviceBuffer> buffer_;
};

TEST_F(EmulatedNcclFault, ALostPeerFailsTheWaitAndEveryLaterOperation) {
  const Fault fault("peer-error");
  const auto group = testing::join_alone_over_nccl(60s);
  const Tensor data = gpu_buffer(64);
  const auto work = group->communicator->all_reduce(data, ReduceOp::Sum);
  const auto start = Clock::now();
  const std::string error = testing::error_of([&] { work->wait(); });
  EXPECT_NE(error.find("nccl all_reduce (sum, 64 floats) on rank 0 of 1 failed: remote process exited or there was "
                       "a network error: NET/Socket : peer 127.0.0.1 closed the connection"),
            std::string::npos)
      << error;
  EXPECT_LT(seconds_since(start), 10.0);  // the asynchronous error, not the 60 s timeout
  // Broken for good: the next operation fails at once with the same words.
  EXPECT_EQ(testing::error_of([&] { group->communicator->all_gather(data); }), error);
  EXPECT_EQ(testing::error_of([&] { group->communicator->barrier(); }), error);
}

TEST_F(EmulatedNcclFault, AHungPeerFailsTheWaitAtTheTimeout) {
  const Fault fault("collective-hang");
  const int64_t aborts = nccl_stand_in::calls().aborts;
  const auto group = testing::join_alone_over_nccl(400ms);
  const auto work = group->communicator->reduce_scatter(gpu_buffer(64));
  const auto start = Clock::now();
  const std::string error = testing::error_of([&] { work->wait(); });
  EXPECT_NE(error.find("nccl reduce_scatter (64 floats) on rank 0 of 1 failed: not done after"), std::string::npos)
      << error;
  EXPECT_GE(seconds_since(start), 0.35);
  EXPECT_EQ(nccl_stand_in::calls().aborts, aborts + 1);
}

Config tiny_config(bool zero1) {
  Config config = testing::tiny_mock_gpt_config("cuda");
  config.global_batch_size = 2;
  config.train_iters = 1;
  config.use_distributed_optimizer = zero1;
  config.ddp_bucket_size = 2000;
  return config;
}

TEST(EmulatedNccl, TheTrainersGradientsGoThroughTheCommunicator) {
  const auto group = testing::join_alone_over_nccl(60s);
  {  // Plain data parallelism: one all-reduce a bucket.
    Trainer trainer(tiny_config(false), group->communicator.get());
    const nccl_stand_in::Calls before = nccl_stand_in::calls();
    trainer.train_step();
    const nccl_stand_in::Calls after = nccl_stand_in::calls();
    // The buckets, plus the host all-reduce of the micro-batches' losses.
    EXPECT_GT(after.all_reduce - before.all_reduce, 2);
    EXPECT_EQ(after.reduce, before.reduce);
  }
  {  // ZeRO-1: the buckets reduced to their owner (the one rank), then one all-gather.
    Trainer trainer(tiny_config(true), group->communicator.get());
    const nccl_stand_in::Calls before = nccl_stand_in::calls();
    trainer.train_step();
    const nccl_stand_in::Calls after = nccl_stand_in::calls();
    EXPECT_GT(after.reduce - before.reduce, 2);
    EXPECT_LE(after.all_reduce - before.all_reduce, 2);  // host scalars: the losses, the norm's sum
    EXPECT_EQ(after.reduce_scatter, before.reduce_scatter);
    EXPECT_EQ(after.all_gather - before.all_gather, 1);
  }
}

}  // namespace
}  // namespace kiln
