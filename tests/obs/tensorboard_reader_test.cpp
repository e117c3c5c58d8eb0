// kiln's reader of event files (src/kiln/obs/tensorboard_reader.h) against what kiln's writer
// writes and the independent test reader reads (event_file_reader.h); fields and values it does not
// know are skipped; every kind of damage is an error naming the file and the byte it is at.
#include "kiln/obs/tensorboard_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/obs/tensorboard_format.h"
#include "kiln/obs/tensorboard_writer.h"
#include "obs/event_file_reader.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::TempDir;

// Protocol buffer fields by hand, for messages kiln's writer never writes.
std::string key(uint32_t field, uint32_t wire_type) {
  return std::string(1, static_cast<char>(field << 3 | wire_type));
}
std::string length_delimited(uint32_t field, const std::string& bytes) {
  return key(field, 2) + static_cast<char>(bytes.size()) + bytes;  // under 128 bytes here
}

TEST(TensorBoardReader, ReadsWhatTheWriterWroteAsTheIndependentReaderDoes) {
  const TempDir dir;
  {
    const auto writer = TensorBoardWriter::open_file(dir / "events", 100);
    writer->add_text("config", "num_layers: 2\nlr: 0.001\n", 0);
    for (int64_t step = 1; step <= 3; ++step) {
      writer->add_scalar("lm loss", 4.0f / static_cast<float>(step), step);
      writer->add_scalar("lm loss vs samples", 4.0f / static_cast<float>(step), 8 * step);
    }
    writer->add_text("estimate", "{\"parameters\": 12}", 0);
  }
  const std::vector<Event> events = read_event_file(dir / "events");
  const auto expected = testing::read_event_file(dir / "events");
  ASSERT_EQ(events.size(), expected.size());
  ASSERT_EQ(events.size(), 9u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE("event " + std::to_string(i));
    EXPECT_EQ(events[i].wall_time, expected[i].wall_time);
    EXPECT_EQ(events[i].step, expected[i].step);
    EXPECT_EQ(events[i].file_version, expected[i].file_version);
    ASSERT_EQ(events[i].values.size(), expected[i].scalars.size() + expected[i].tensors.size());
    for (const testing::ScalarValue& scalar : expected[i].scalars) {
      EXPECT_EQ(events[i].values[0].tag, scalar.tag);
      EXPECT_EQ(events[i].values[0].simple_value, scalar.value);
      EXPECT_FALSE(events[i].values[0].text);
    }
    for (const testing::TensorValue& tensor : expected[i].tensors) {
      EXPECT_EQ(events[i].values[0].tag, tensor.tag);
      EXPECT_EQ(events[i].values[0].text, tensor.strings.at(0));
      EXPECT_FALSE(events[i].values[0].simple_value);
    }
  }
  EXPECT_EQ(events[1].values[0].text, "num_layers: 2\nlr: 0.001\n");
  EXPECT_EQ(events[7].step, 24);
  EXPECT_EQ(events[7].values[0].tag, "lm loss vs samples");
  EXPECT_EQ(events[7].values[0].simple_value, 4.0f / 3.0f);
}

TEST(TensorBoardReader, SkipsWhatItDoesNotKnow) {
  const std::string wall = key(1, 1) + std::string(8, '\0');
  // A histogram (Value field 5), a string tensor of another plugin, an unknown Event field 14 and
  // an unknown Value field 15 of each wire type.
  const std::string histogram =
      length_delimited(1, "weights") + length_delimited(5, std::string("\x09", 1) + std::string(8, '\0'));
  const std::string other_plugin = length_delimited(1, "note") +
                                   length_delimited(8, key(1, 0) + '\x07' + length_delimited(8, "hi")) +
                                   length_delimited(9, length_delimited(1, length_delimited(1, "images")));
  const std::string scalar = length_delimited(1, "lm loss") + key(15, 0) + '\x05' + key(15, 1) + std::string(8, 'x') +
                             key(15, 5) + "abcd" + key(2, 5) + std::string("\x00\x00\x80\x3f", 4);  // 1.0f
  const std::string summary =
      length_delimited(1, histogram) + length_delimited(1, other_plugin) + length_delimited(1, scalar);
  const std::string event = wall + key(2, 0) + '\x07' + key(14, 0) + '\x01' + length_delimited(5, summary);
  std::string records;
  append_tf_record(records, event);
  const std::vector<Event> events = decode_event_file(records, "crafted");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].step, 7);
  ASSERT_EQ(events[0].values.size(), 3u);
  EXPECT_EQ(events[0].values[0].tag, "weights");
  EXPECT_FALSE(events[0].values[0].simple_value || events[0].values[0].text);
  EXPECT_EQ(events[0].values[1].tag, "note");
  EXPECT_FALSE(events[0].values[1].text) << "a string tensor of the images plugin is no text summary";
  EXPECT_EQ(events[0].values[2].simple_value, 1.0f);
}

TEST(TensorBoardReader, DamageIsAnErrorNamingTheFileAndTheByte) {
  std::string records;
  append_tf_record(records, encode_file_version_event(1.5e9));
  const size_t second = records.size();
  append_tf_record(records, encode_scalar_event(1.5e9, 1, "lm loss", 2.0f));
  const std::string prefix = "TensorBoard event file 'run/events' is damaged at byte ";
  const auto error_for = [&](const std::string& bytes) {
    return error_of([&] { decode_event_file(bytes, "run/events"); });
  };

  EXPECT_EQ(
      error_for(records.substr(0, second + 5)),
      prefix + std::to_string(second) + " (record 2): the file ends within a record's header (5 of its 12 bytes)");
  EXPECT_EQ(error_for(records.substr(0, records.size() - 2)),
            prefix + std::to_string(second) + " (record 2): the record holds " +
                std::to_string(records.size() - second - 16) + " bytes but the file ends " +
                std::to_string(records.size() - second - 14) + " bytes after its header, cut short");
  std::string bad_length = records;
  bad_length[second] ^= 0x01;
  EXPECT_EQ(error_for(bad_length),
            prefix + std::to_string(second) + " (record 2): the CRC-32C of the record's length does not match");
  std::string bad_data = records;
  bad_data[records.size() - 6] ^= 0x40;  // inside the float
  EXPECT_EQ(error_for(bad_data), prefix + std::to_string(second) + " (record 2): the CRC-32C of the record's " +
                                     std::to_string(records.size() - second - 16) + " bytes does not match");
  // Intact framing around a message that is not an Event: a string field longer than the record.
  std::string malformed;
  append_tf_record(malformed, key(3, 2) + '\x40' + "brain");
  EXPECT_EQ(error_for(malformed), prefix + "0 (record 1): a field of 64 bytes where its message has 5 left");
}

TEST(TensorBoardReader, UnreadableFileIsAnErrorNamingIt) {
  const TempDir dir;
  EXPECT_EQ(error_of([&] { read_event_file(dir / "missing"); }),
            "cannot read TensorBoard event file '" + dir / "missing" + "': No such file or directory");
  EXPECT_EQ(error_of([&] { read_event_file(dir.path()); }),
            "cannot read TensorBoard event file '" + dir.path() + "': Is a directory");
}

}  // namespace
}  // namespace kiln
