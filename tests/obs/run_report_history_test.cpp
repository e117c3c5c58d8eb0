// A run's event files merged into one history (obs/run_report_history.h): a resumed run's files
// joined, a repeated step taken from the later wall time whatever the files' names, the latest
// config, the wall time without the pause between, and errors that name the folder or the file.
#include "kiln/obs/run_report_history.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/obs/tensorboard_format.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

void write_events(const std::string& path, const std::vector<std::string>& events) {
  std::string bytes;
  for (const std::string& event : events) append_tf_record(bytes, event);
  testing::write_file_bytes(path, bytes);
}

// A run of `steps`, its `lm loss` at step s being offset + s, one event a second from `wall`.
std::vector<std::string> run_events(double wall, std::vector<int64_t> steps, float offset, const std::string& config) {
  std::vector<std::string> events = {encode_file_version_event(wall),
                                     encode_text_event(wall, steps.front() - 1, "config", config)};
  for (const int64_t step : steps)
    events.push_back(encode_scalar_event(wall + static_cast<double>(step - steps.front() + 1), step, "lm loss",
                                         offset + static_cast<float>(step)));
  return events;
}

TEST(RunReportHistory, MergesAResumedRunsFilesAndTheLaterWallTimeWinsARepeatedStep) {
  const TempDir dir;
  // The first run (steps 1-4, from wall time 100) in the file whose name sorts last, the resumed
  // one (from its checkpoint at 2: steps 3-6, from wall time 200) in the one that sorts first.
  write_events(dir / "events.out.tfevents.0000000002.host.1.0", run_events(100, {1, 2, 3, 4}, 10, "train_iters: 4\n"));
  write_events(dir / "events.out.tfevents.0000000001.host.2.0", run_events(200, {3, 4, 5, 6}, 20, "train_iters: 6\n"));
  testing::write_file_bytes(dir / "report.html", "not an event file");
  const RunHistory history = read_run_history(dir.path());
  EXPECT_EQ(history.folder, dir.path());
  EXPECT_EQ(history.files, (std::vector<std::string>{dir / "events.out.tfevents.0000000001.host.2.0",
                                                     dir / "events.out.tfevents.0000000002.host.1.0"}));
  std::vector<std::pair<int64_t, double>> loss;
  for (const ScalarPoint& point : history.scalar("lm loss")) loss.emplace_back(point.step, point.value);
  EXPECT_EQ(loss, (std::vector<std::pair<int64_t, double>>{{1, 11}, {2, 12}, {3, 23}, {4, 24}, {5, 25}, {6, 26}}));
  ASSERT_NE(history.text("config"), nullptr);
  EXPECT_EQ(*history.text("config"), "train_iters: 6\n");
  EXPECT_EQ(history.text("estimate"), nullptr);
  EXPECT_TRUE(history.scalar("throughput").empty());
  EXPECT_DOUBLE_EQ(history.wall_seconds, 4 + 4);  // 100 to 104 and 200 to 204, not 100 to 204
}

TEST(RunReportHistory, AFolderWithoutEventFilesIsAnErrorNamingIt) {
  const TempDir dir;
  testing::write_file_bytes(dir / "report.html", "x");
  EXPECT_EQ(error_of([&] { read_run_history(dir.path()); }), "no TensorBoard event files (events.out.tfevents.*) in '" +
                                                                 dir.path() +
                                                                 "': give the --tensorboard-dir of a kiln train run");
  EXPECT_EQ(error_of([&] { read_run_history(dir / "missing"); }),
            "cannot report on '" + dir / "missing" + "': there is no such folder");
  EXPECT_EQ(error_of([&] { read_run_history(dir / "report.html"); }),
            "cannot report on '" + dir / "report.html" +
                "': it is a file, not a folder (give the --tensorboard-dir of a kiln train run)");
}

TEST(RunReportHistory, ADamagedOrUnreadableFileIsAnErrorNamingIt) {
  const TempDir dir;
  write_events(dir / "events.out.tfevents.1.host.1.0", run_events(100, {1, 2}, 0, "a: 1\n"));
  std::string damaged = testing::read_file_bytes(dir / "events.out.tfevents.1.host.1.0");
  damaged.resize(damaged.size() - 1);
  testing::write_file_bytes(dir / "events.out.tfevents.2.host.1.0", damaged);
  EXPECT_TRUE(
      error_of([&] {
        read_run_history(dir.path());
      }).starts_with("TensorBoard event file '" + dir / "events.out.tfevents.2.host.1.0" + "' is damaged at byte "));
  std::filesystem::remove(dir / "events.out.tfevents.2.host.1.0");
  std::filesystem::create_directory(dir / "events.out.tfevents.3.host.1.0");
  EXPECT_EQ(error_of([&] { read_run_history(dir.path()); }),
            "cannot read TensorBoard event file '" + dir / "events.out.tfevents.3.host.1.0" + "': Is a directory");
}

}  // namespace
}  // namespace kiln
