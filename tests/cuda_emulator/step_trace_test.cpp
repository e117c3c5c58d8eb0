// --profile on the CUDA back-end: the device work inside the traced ops goes on the trace's
// "compute stream" track, the batches' copies on "copy stream" and NCCL's collectives on
// "communication stream" (backend/op_tracing.h). The emulator runs a stream's work when it is
// waited for, so its device times say nothing of a GPU's; what is checked is what the tracks hold.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/obs/step_trace.h"
#include "kiln/train/trainer.h"
#include "support/nccl_group.h"
#include "support/small_gpt.h"
#include "support/temp_dir.h"

namespace kiln::testing {
namespace {

TEST(EmulatedStepTrace, TheDeviceWorkOfTheTracedStepGoesOnItsStreamsTracks) {
  const TempDir dir;
  Config config = tiny_mock_gpt_config("cuda");
  config.global_batch_size = 4;  // two micro-batches, each copied
  config.train_iters = 3;
  config.profile = true;
  config.profile_step_start = 1;
  config.profile_step_end = 2;
  config.profile_dir = dir / "p";
  std::string path;
  {
    const std::unique_ptr<ProcessGroup> group = join_alone_over_nccl();
    Trainer trainer(config, group->communicator.get());
    StepTraceObserver observer({.step_start = 1, .step_end = 2, .dir = config.profile_dir, .file_name = "t.pt.trace.json"},
                               *trainer.tracing());
    trainer.add_observer(&observer);
    trainer.run();
    path = observer.written_path();
    EXPECT_FALSE(cuda::launch_timing()) << "the trace's end turns the device timing off";
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int64_t> tids;
  for (const auto& event : trace.at("traceEvents"))
    if (event.at("ph") == "M" && event.at("name") == "thread_name") tids[event.at("args").at("name")] = event.at("tid");
  for (const char* track : {"trainer", "compute stream", "copy stream", "communication stream"})
    ASSERT_TRUE(tids.contains(track)) << "no track " << track;
  int64_t device_ops = 0;
  std::map<std::string, std::vector<std::string>> device_work;  // by track
  std::map<int64_t, double> previous_end;                        // by tid
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    const int64_t tid = event.at("tid");
    const std::string name = event.at("name");
    if (tid == tids["trainer"]) {
      device_ops += event.at("cat") == "op" && !name.starts_with("copy_to_");
      continue;
    }
    EXPECT_EQ(event.at("cat"), "device");
    EXPECT_FALSE(name.empty());
    // A stream runs its work one piece after another.
    const double start = event.at("ts"), duration = event.at("dur");
    if (previous_end.contains(tid)) EXPECT_GE(start, previous_end[tid] - 1e-3) << name;
    EXPECT_GE(duration, 0.0);
    previous_end[tid] = start + duration;
    for (const auto& [track, id] : tids)
      if (id == tid) device_work[track].push_back(name);
  }
  EXPECT_GT(device_ops, 0);
  EXPECT_GE(static_cast<int64_t>(device_work["compute stream"].size()), device_ops)
      << "every device op issues a kernel or a library call at least";
  // The traced iteration's two micro-batches.
  EXPECT_EQ(device_work["copy stream"],
            (std::vector<std::string>(2, "host-to-device copy of a micro-batch")));
  // The gradients' buckets, and the gather of the token lookups the tied embedding's gradient adds
  // after them (train/embedding_lookups.h).
  int64_t all_reduces = 0;
  for (const std::string& collective : device_work["communication stream"]) {
    EXPECT_TRUE(collective.starts_with("all_reduce (sum, ") || collective.starts_with("all_gather (")) << collective;
    all_reduces += collective.starts_with("all_reduce");
  }
  EXPECT_GE(all_reduces, 1);
}

}  // namespace
}  // namespace kiln::testing
