// Backend::capture: ops recorded into a graph run only when it is replayed, each replay runs them
// again on what their buffers then hold, and an op that copies to the host while being recorded
// fails the capture with an error that says so, leaving the back-end usable. The CPU back-end has
// no graphs. CUDA cases skip with the reason where no GPU is usable (the emulator runs them in CI).
#include <gtest/gtest.h>

#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/core/error.h"
#include "support/backends.h"
#include "support/device_tensors.h"

namespace kiln {
namespace {

TEST(CudaGraphs, RecordedOpsRunOnlyWhenReplayedAndEachReplayRunsThemAgain) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  std::unique_ptr<Backend> backend = make_backend("cuda");
  testing::DeviceTensors t(*backend);
  // total += step: the embedding gradient of one position, token 0 (wpe's gradient is unused).
  const Tensor total = t.floats({1.0f, 2.0f, 3.0f}, {1, 3});
  const Tensor step = t.floats({0.5f, 0.25f, 2.0f}, {1, 1, 3});
  const Tensor position_gradient = t.poisoned({1, 3}), token = t.ints({0}, {1, 1});
  const auto accumulate = [&] {
    backend->embedding_backward({total, position_gradient, step, token, GradStore::Write});
  };
  accumulate();  // once directly: nothing to settle, but as callers do
  const std::unique_ptr<OpGraph> graph = backend->capture(accumulate);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(t.download(total), (std::vector<float>{1.5f, 2.25f, 5.0f})) << "recording ran the op";
  graph->replay();
  graph->replay();
  EXPECT_EQ(t.download(total), (std::vector<float>{2.5f, 2.75f, 9.0f}));
  backend->copy_to_device(step.data, std::vector<float>{1.0f, 1.0f, 1.0f}.data(),
                          3 * sizeof(float));
  graph->replay();  // reads the step's new contents
  EXPECT_EQ(t.download(total), (std::vector<float>{3.5f, 3.75f, 10.0f}));
  EXPECT_NE(backend->run_notes().find("CUDA graphs: 1 captured, 3 replays"), std::string::npos)
      << backend->run_notes();
}

TEST(CudaGraphs, ACopyWhileRecordingFailsTheCaptureAndLeavesTheBackendUsable) {
  const std::string reason = testing::backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  std::unique_ptr<Backend> backend = make_backend("cuda");
  testing::DeviceTensors t(*backend);
  const Tensor values = t.floats({1.0f, 2.0f}, {2});
  float host[2] = {};
  try {
    backend->capture([&] {
      backend->fill({values, 7.0f});
      backend->copy_to_host(host, values.data, sizeof(host));
    });
    FAIL() << "the capture should have failed";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("capture"), std::string::npos) << error.what();
  }
  EXPECT_EQ(t.download(values), (std::vector<float>{1.0f, 2.0f})) << "nothing recorded ran";
  backend->fill({values, 3.0f});
  EXPECT_EQ(t.download(values), (std::vector<float>{3.0f, 3.0f}))
      << "the back-end works after the failure";
}

TEST(CpuGraphs, TheCpuBackendRecordsNothing) {
  std::unique_ptr<Backend> backend = make_backend("cpu");
  bool called = false;
  EXPECT_EQ(backend->capture([&] { called = true; }), nullptr);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace kiln
