// The event file's bytes against a reader written from the published formats (event_file_reader.h),
// CRC-32C against its published check values, and the writer's promises: a file named as
// TensorFlow names its own, a clear error for a folder it cannot write, a full queue that drops
// and counts instead of blocking, and a failed write reported once.
#include "kiln/obs/tensorboard_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/obs/tensorboard_format.h"
#include "obs/event_file_reader.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

TEST(TensorBoardFormat, Crc32cMatchesPublishedCheckValues) {
  // RFC 3720 (iSCSI) appendix B.4 and the CRC catalogue's CRC-32/ISCSI check value.
  const std::string digits = "123456789", zeros(32, '\0'), ones(32, '\xff');
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  for (const auto& [bytes, expected] : {std::pair{digits, 0xE3069283u},
                                        {zeros, 0x8A9136AAu},
                                        {ones, 0x62A8AB43u},
                                        {ascending, 0x46DD794Eu},
                                        {descending, 0x113FDB5Cu}}) {
    EXPECT_EQ(crc32c(bytes), expected) << "kiln's, " << bytes.size() << " bytes";
    EXPECT_EQ(testing::bitwise_crc32c(bytes), expected) << "the test reader's, " << bytes.size() << " bytes";
    EXPECT_EQ(masked_crc32c(bytes), testing::tf_record_mask(expected));
  }
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TensorBoardFormat, ScalarEventDecodesWithTheIndependentReader) {
  std::string records;
  append_tf_record(records, encode_file_version_event(1.5e9));
  append_tf_record(records, encode_scalar_event(1.5e9 + 0.25, 7, "lm loss", 3.25f));
  append_tf_record(records, encode_scalar_event(1.5e9 + 0.5, int64_t{1} << 40, "learning-rate vs samples", 6e-4f));
  const auto events = testing::decode_event_records(records);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[0].wall_time, 1.5e9);
  EXPECT_TRUE(events[0].scalars.empty());
  EXPECT_EQ(events[1].wall_time, 1.5e9 + 0.25);
  EXPECT_EQ(events[1].step, 7);
  ASSERT_EQ(events[1].scalars.size(), 1u);
  EXPECT_EQ(events[1].scalars[0].tag, "lm loss");
  EXPECT_EQ(events[1].scalars[0].value, 3.25f);
  EXPECT_EQ(events[2].step, int64_t{1} << 40);  // a multi-byte varint
  EXPECT_EQ(events[2].scalars[0].tag, "learning-rate vs samples");
  EXPECT_EQ(events[2].scalars[0].value, 6e-4f);
  // A flipped bit anywhere is caught by one of the two CRCs.
  for (const size_t at : {size_t{0}, size_t{9}, size_t{20}, records.size() - 1}) {
    std::string corrupted = records;
    corrupted[at] = static_cast<char>(corrupted[at] ^ 0x10);
    EXPECT_THROW(testing::decode_event_records(corrupted), std::runtime_error) << "byte " << at;
  }
}

TEST(TensorBoardFormat, TextEventIsTheTextPluginsRankZeroStringTensor) {
  const std::string yaml = "num_layers: 2\ndata_path: \"a b\"\n", unicode = "loss \xe2\x86\x93";  // UTF-8 arrow
  std::string records;
  append_tf_record(records, encode_text_event(1.5e9, 3, "config", yaml));
  append_tf_record(records, encode_text_event(1.5e9 + 1, 4, "note", unicode));
  append_tf_record(records, encode_text_event(1.5e9 + 2, 5, "empty", ""));
  const auto events = testing::decode_event_records(records);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].step, 3);
  EXPECT_TRUE(events[0].scalars.empty());  // no simple_value: not a scalar to TensorBoard
  ASSERT_EQ(events[0].tensors.size(), 1u);
  const testing::TensorValue& tensor = events[0].tensors[0];
  EXPECT_EQ(tensor.tag, "config");
  EXPECT_EQ(tensor.plugin_name, "text");
  EXPECT_EQ(tensor.dtype, 7u);  // DT_STRING
  EXPECT_TRUE(tensor.has_shape);
  EXPECT_EQ(tensor.shape_dims, 0u);  // rank 0, as tensor_util.make_tensor_proto makes a Python string
  EXPECT_EQ(tensor.strings, std::vector<std::string>{yaml});
  const testing::TextSeries texts = testing::text_series(events);
  EXPECT_EQ(texts.at("config").at(3), yaml);
  EXPECT_EQ(texts.at("note").at(4), unicode);
  EXPECT_EQ(texts.at("empty").at(5), "");
}

TEST(TensorBoardWriter, FileIsNamedAsTensorFlowNamesItsOwnInACreatedFolder) {
  const TempDir dir;
  const std::string folder = dir / "runs/a";  // parents created too
  const double before = static_cast<double>(std::time(nullptr));
  std::string first, second;
  {
    const auto writer = TensorBoardWriter::create_in(folder, 16);
    const auto other = TensorBoardWriter::create_in(folder, 16);  // same second, same process: a new file
    first = writer->path();
    second = other->path();
    writer->add_scalar("lm loss", 2.5f, 1);
  }
  EXPECT_NE(first, second);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::regex name(R"(events\.out\.tfevents\.(\d{10})\.)" + std::string(host) + "\\." +
                        std::to_string(::getpid()) + R"(\.\d+)");
  std::smatch match;
  const std::string file = std::filesystem::path(first).filename().string();
  ASSERT_TRUE(std::regex_match(file, match, name)) << file;
  EXPECT_NEAR(std::stod(match[1].str()), before, 2.0);
  EXPECT_EQ(std::filesystem::path(first).parent_path(), folder);
  EXPECT_EQ(testing::event_files_in(folder).size(), 2u);

  const auto events = testing::read_event_file(first);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].scalars.at(0).tag, "lm loss");
  EXPECT_NEAR(events[1].wall_time, before, 5.0);
  EXPECT_EQ(testing::read_event_file(second).size(), 1u);  // the version record alone
}

TEST(TensorBoardWriter, UnwritableFolderIsAnErrorNamingIt) {
  const TempDir dir;
  testing::write_file_bytes(dir / "a-file", "x");
  const std::string below_a_file = error_of([&] { TensorBoardWriter::create_in(dir / "a-file/tb", 16); });
  EXPECT_NE(below_a_file.find("cannot write TensorBoard events into '" + dir / "a-file/tb" + "'"), std::string::npos)
      << below_a_file;
  // A folder that exists but takes no new file (sysfs refuses even root).
  const std::string read_only = error_of([&] { TensorBoardWriter::create_in("/sys", 16); });
  EXPECT_NE(read_only.find("cannot write TensorBoard events into '/sys': cannot create '/sys/events.out.tfevents."),
            std::string::npos)
      << read_only;
}

TEST(TensorBoardWriter, FullQueueDropsAndCountsWithoutBlocking) {
  // The writer writes into a pipe of one page that nobody reads yet: its thread blocks, as on a
  // stalled disk, and the queue of 8 fills.
  int pipe_ends[2];
  ASSERT_EQ(::pipe(pipe_ends), 0);
  ::fcntl(pipe_ends[1], F_SETPIPE_SZ, 4096);
  auto writer = TensorBoardWriter::open_file("/proc/self/fd/" + std::to_string(pipe_ends[1]), 8);
  ::close(pipe_ends[1]);  // the writer has its own descriptor; the reader sees the end when it closes
  constexpr int kScalars = 5000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kScalars; ++i) writer->add_scalar("lm loss", static_cast<float>(i), i);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);  // microseconds each; one blocked call would never return
  const int64_t dropped = writer->dropped_events();
  EXPECT_GE(dropped, kScalars - 400);  // a page holds about 100 records, plus two queues' worth
  EXPECT_FALSE(writer->write_failed());

  std::string bytes;
  std::thread reader([&] {
    char buffer[4096];
    for (ssize_t got; (got = ::read(pipe_ends[0], buffer, sizeof(buffer))) > 0;)
      bytes.append(buffer, static_cast<size_t>(got));
  });
  ::testing::internal::CaptureStderr();
  writer.reset();  // writes what was queued, then closes: the reader sees the end
  const std::string said = ::testing::internal::GetCapturedStderr();
  reader.join();
  ::close(pipe_ends[0]);
  EXPECT_NE(said.find(std::to_string(dropped) + " events were dropped"), std::string::npos) << said;
  EXPECT_NE(said.find("--tensorboard-queue-size"), std::string::npos) << said;

  const auto events = testing::decode_event_records(bytes);
  ASSERT_EQ(static_cast<int64_t>(events.size()), 1 + kScalars - dropped);  // the version record, and the kept
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].scalars.at(0).value, static_cast<float>(events[i].step));
    if (i > 1) {
      EXPECT_GT(events[i].step, events[i - 1].step);  // in order, gaps where dropped
    }
  }
}

TEST(TensorBoardWriter, TextsAndScalarsKeepTheirOrder) {
  const TempDir dir;
  {
    const auto writer = TensorBoardWriter::open_file(dir / "events", 16);
    writer->add_text("config", "lr: 0.001\n", 0);
    writer->add_scalar("lm loss", 2.5f, 1);
    writer->add_text("estimate", "{}", 0);
  }
  const auto events = testing::read_event_file(dir / "events");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1].tensors.at(0).strings.at(0), "lr: 0.001\n");
  EXPECT_EQ(events[2].scalars.at(0).tag, "lm loss");
  EXPECT_EQ(events[3].tensors.at(0).tag, "estimate");
}

TEST(TensorBoardWriter, WriteErrorIsReportedOnceAndLaterEventsAreDropped) {
  ::testing::internal::CaptureStderr();
  {
    const auto writer = TensorBoardWriter::open_file("/dev/full", 1000);  // every write: ENOSPC
    for (int i = 1; i <= 10; ++i) writer->add_scalar("lm loss", 1.0f, i);
    writer->flush();
    EXPECT_TRUE(writer->write_failed());
    for (int i = 11; i <= 20; ++i) writer->add_scalar("lm loss", 1.0f, i);  // returns, drops
    writer->add_text("config", "lr: 0.001\n", 20);                          // and so do texts
    writer->flush();
    EXPECT_EQ(writer->dropped_events(), 22);  // the version record, 20 scalars and the text
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  EXPECT_NE(said.find("kiln: TensorBoard: writing '/dev/full' failed (No space left on device); training goes on"),
            std::string::npos)
      << said;
}

}  // namespace
}  // namespace kiln
