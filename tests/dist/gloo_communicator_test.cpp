// GlooCommunicator's operations among ranks that are threads of this process, each with its own
// store connection and Gloo context over 127.0.0.1 (the training tests use real processes).
#include "kiln/dist/gloo_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/error_of.h"
#include "support/gloo_ranks.h"

namespace kiln {
namespace {

using testing::on_gloo_ranks;

Tensor host_tensor(std::vector<float>& values) {
  return Tensor{values.data(), Shape{static_cast<int64_t>(values.size())}, DType::F32, Device::CPU};
}

TEST(GlooCommunicator, AllReduceSumsAndTakesTheMaximumOnEveryRank) {
  on_gloo_ranks(3, [](GlooCommunicator& comm) {
    const int r = comm.rank();
    std::vector<float> values(1001);  // odd: Gloo's ring cuts it into unequal pieces
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 1000.0f * static_cast<float>(r);
    auto work = comm.all_reduce(host_tensor(values), ReduceOp::Sum);
    work->wait();
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], 3.0f * static_cast<float>(i) + 3000.0f) << i;
    std::vector<float> largest{static_cast<float>(r), -static_cast<float>(r)};
    comm.all_reduce(host_tensor(largest), ReduceOp::Max)->wait();
    EXPECT_EQ(largest, (std::vector<float>{2.0f, 0.0f}));
  });
}

TEST(GlooCommunicator, ReduceScatterLeavesEachRankTheSumOfItsShard) {
  for (const int ranks : {2, 3, 4}) {
    on_gloo_ranks(ranks, [ranks](GlooCommunicator& comm) {
      const int r = comm.rank();
      std::vector<float> values(static_cast<size_t>(ranks) * 5);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i * (r + 1));
      comm.reduce_scatter(host_tensor(values))->wait();
      const auto total = static_cast<size_t>(ranks * (ranks + 1) / 2);  // 1 + 2 + ... + ranks
      for (size_t i = 5 * static_cast<size_t>(r); i < 5 * static_cast<size_t>(r + 1); ++i)
        EXPECT_EQ(values[i], static_cast<float>(i * total)) << ranks << " ranks, rank " << r << " element " << i;
    });
  }
}

TEST(GlooCommunicator, APreparedAllReduceSumsItsBufferAtEachStartAmongOtherOperations) {
  for (const int ranks : {2, 3, 4}) {
    on_gloo_ranks(ranks, [ranks](GlooCommunicator& comm) {
      const int r = comm.rank();
      // Beyond kPreparedElements, each start is a one-off all-reduce. (Large buffers at 3 and 4 ranks
      // take Gloo's ring tens of seconds among threads of one process, not among processes.)
      const size_t large_size = ranks == 2 ? static_cast<size_t>(GlooCommunicator::kPreparedElements) + 1 : 5;
      std::vector<float> bucket(1001), other(7), large(large_size);
      const auto prepared = comm.prepare_all_reduce(host_tensor(bucket));
      const auto prepared_large = comm.prepare_all_reduce(host_tensor(large));
      const auto total = static_cast<float>(ranks * (ranks + 1) / 2);            // 1 + 2 + ... + ranks
      for (int step = 0; step < 3; ++step) {
        for (size_t i = 0; i < bucket.size(); ++i) bucket[i] = static_cast<float>((i + step) * (r + 1));
        other.assign(other.size(), static_cast<float>(r));
        large.assign(large.size(), static_cast<float>(r + 1));
        auto work = prepared->start();
        comm.all_reduce(host_tensor(other), ReduceOp::Max)->wait();
        prepared_large->start()->wait();
        work->wait();
        for (size_t i = 0; i < bucket.size(); ++i)
          ASSERT_EQ(bucket[i], static_cast<float>(i + step) * total) << ranks << " ranks, step " << step << ", " << i;
        EXPECT_EQ(other.front(), static_cast<float>(ranks - 1));
        EXPECT_EQ(large.back(), total);
      }
    });
  }
}

TEST(GlooCommunicator, ReduceLeavesTheRootTheSumWhicheverRankItIs) {
  for (const int ranks : {2, 3, 4}) {
    on_gloo_ranks(ranks, [ranks](GlooCommunicator& comm) {
      const int r = comm.rank();
      for (int root = 0; root < ranks; ++root) {
        std::vector<float> values(37);  // odd: not a multiple of the ranks
        for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i * (r + 1) + root);
        comm.reduce(host_tensor(values), root)->wait();
        if (r != root) continue;
        const auto total = static_cast<size_t>(ranks * (ranks + 1) / 2);  // 1 + 2 + ... + ranks
        for (size_t i = 0; i < values.size(); ++i)
          ASSERT_EQ(values[i], static_cast<float>(i * total + static_cast<size_t>(ranks * root)))
              << ranks << " ranks, root " << root << " element " << i;
      }
    });
  }
}

TEST(GlooCommunicator, AllGatherFillsEveryShardInPlaceWhateverTheDtype) {
  on_gloo_ranks(4, [](GlooCommunicator& comm) {
    const int r = comm.rank();
    std::vector<uint16_t> values(4 * 3, 0xffff);  // bf16-sized elements
    for (size_t i = 0; i < 3; ++i) values[3 * static_cast<size_t>(r) + i] = static_cast<uint16_t>(100 * r + i);
    comm.all_gather(Tensor{values.data(), Shape{12}, DType::BF16, Device::CPU})->wait();
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], 100 * (i / 3) + i % 3) << i;
  });
}

TEST(GlooCommunicator, BroadcastBarrierAndHostScalars) {
  on_gloo_ranks(2, [](GlooCommunicator& comm) {
    const int r = comm.rank();
    std::vector<float> values{static_cast<float>(r), 7.0f * static_cast<float>(r)};
    comm.broadcast(host_tensor(values), 1)->wait();
    EXPECT_EQ(values, (std::vector<float>{1.0f, 7.0f}));
    comm.barrier();
    std::vector<double> scalars{0.25 + r, r == 1 ? 1e300 : 0.0};
    comm.all_reduce_host(scalars, ReduceOp::Sum);
    EXPECT_EQ(scalars, (std::vector<double>{1.5, 1e300}));
  });
}

TEST(GlooCommunicator, OperationsCompleteInTheOrderTheyWereIssued) {
  on_gloo_ranks(2, [](GlooCommunicator& comm) {
    std::vector<std::vector<float>> buckets(8, std::vector<float>(257, 1.0f));
    std::vector<std::unique_ptr<CommWork>> works;
    for (auto& bucket : buckets) works.push_back(comm.all_reduce(host_tensor(bucket), ReduceOp::Sum));
    works.back()->wait();  // the last done means all before it are
    for (const auto& bucket : buckets) EXPECT_EQ(bucket.front(), 2.0f);
    for (const auto& work : works) work->wait();
  });
}

TEST(GlooCommunicator, GpuBuffersAndUnevenShardsAreErrorsNamingTheOperation) {
  on_gloo_ranks(2, [](GlooCommunicator& comm) {
    std::vector<float> values(5);
    Tensor on_gpu = host_tensor(values);
    on_gpu.device = Device::CUDA;
    EXPECT_NE(testing::error_of([&] { comm.all_reduce(on_gpu, ReduceOp::Sum); }).find("gloo all_reduce: the buffer is on the GPU"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] { comm.reduce_scatter(host_tensor(values)); })
                  .find("gloo reduce_scatter: 5 elements do not split into 2 equal shards"),
              std::string::npos);
    EXPECT_NE(testing::error_of([&] { comm.reduce(host_tensor(values), 2); })
                  .find("gloo reduce: root 2 outside world size 2"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace kiln
