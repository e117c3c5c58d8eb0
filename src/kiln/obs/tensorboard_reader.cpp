#include "kiln/obs/tensorboard_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <system_error>

#include "kiln/core/error.h"
#include "kiln/obs/tensorboard_format.h"

namespace kiln {
namespace {

uint64_t little_endian(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return value;
}

// The fields of one protocol buffer message in order (protobuf.dev/programming-guides/encoding):
// next() reads a key, then exactly one of the value readers or skip() takes its value. A value that
// runs past the message is a kiln::Error.
class ProtoFields {
 public:
  enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

  explicit ProtoFields(std::string_view message) : rest_(message) {}

  bool next() {
    if (rest_.empty()) return false;
    const uint64_t key = varint();
    field_ = static_cast<uint32_t>(key >> 3);
    type_ = static_cast<uint32_t>(key & 7u);
    return true;
  }
  bool is(uint32_t field, WireType type) const { return field_ == field && type_ == type; }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto byte = static_cast<uint8_t>(take(1)[0]);
      value |= static_cast<uint64_t>(byte & 0x7Fu) << shift;
      if ((byte & 0x80u) == 0) return value;
    }
    fail("a varint longer than ten bytes");
  }
  uint64_t fixed64() { return little_endian(take(8)); }
  uint32_t fixed32() { return static_cast<uint32_t>(little_endian(take(4))); }
  std::string_view bytes() {
    const uint64_t length = varint();
    KILN_CHECK(length <= rest_.size(), "a field of {} bytes where its message has {} left", length, rest_.size());
    return take(static_cast<size_t>(length));
  }
  void skip() {
    switch (type_) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        take(8);
        return;
      case kLengthDelimited:
        bytes();
        return;
      case kFixed32:
        take(4);
        return;
      default:
        fail("field {} has wire type {}, which protocol buffers do not have", field_, type_);
    }
  }

 private:
  std::string_view take(size_t count) {
    KILN_CHECK(count <= rest_.size(), "a field runs past the end of its message");
    const std::string_view taken = rest_.substr(0, count);
    rest_.remove_prefix(count);
    return taken;
  }

  std::string_view rest_;
  uint32_t field_ = 0, type_ = 0;
};

using Wire = ProtoFields::WireType;

// SummaryMetadata.plugin_data.plugin_name.
std::string plugin_name(std::string_view metadata) {
  std::string name;
  for (ProtoFields fields(metadata); fields.next();) {
    if (!fields.is(1, Wire::kLengthDelimited)) {
      fields.skip();
      continue;
    }
    for (ProtoFields plugin_data(fields.bytes()); plugin_data.next();) {
      if (plugin_data.is(1, Wire::kLengthDelimited)) {
        name = plugin_data.bytes();
      } else {
        plugin_data.skip();
      }
    }
  }
  return name;
}

// The first string_val of a DT_STRING TensorProto (a text summary's is rank 0 or [1]).
std::optional<std::string> first_string(std::string_view tensor) {
  uint64_t dtype = 0;
  std::optional<std::string> first;
  for (ProtoFields fields(tensor); fields.next();) {
    if (fields.is(1, Wire::kVarint)) {
      dtype = fields.varint();
    } else if (fields.is(8, Wire::kLengthDelimited) && !first) {
      first = std::string(fields.bytes());
    } else {
      fields.skip();
    }
  }
  return dtype == kDataTypeString ? first : std::nullopt;
}

EventValue decode_value(std::string_view message) {
  EventValue value;
  std::optional<std::string> tensor_text;
  std::string plugin;
  for (ProtoFields fields(message); fields.next();) {
    if (fields.is(1, Wire::kLengthDelimited)) {
      value.tag = fields.bytes();
    } else if (fields.is(2, Wire::kFixed32)) {
      value.simple_value = std::bit_cast<float>(fields.fixed32());
    } else if (fields.is(8, Wire::kLengthDelimited)) {
      tensor_text = first_string(fields.bytes());
    } else if (fields.is(9, Wire::kLengthDelimited)) {
      plugin = plugin_name(fields.bytes());
    } else {
      fields.skip();
    }
  }
  if (plugin == kTextPluginName) value.text = std::move(tensor_text);
  return value;
}

Event decode_event(std::string_view message) {
  Event event;
  for (ProtoFields fields(message); fields.next();) {
    if (fields.is(1, Wire::kFixed64)) {
      event.wall_time = std::bit_cast<double>(fields.fixed64());
    } else if (fields.is(2, Wire::kVarint)) {
      event.step = static_cast<int64_t>(fields.varint());
    } else if (fields.is(3, Wire::kLengthDelimited)) {
      event.file_version = fields.bytes();
    } else if (fields.is(5, Wire::kLengthDelimited)) {
      for (ProtoFields summary(fields.bytes()); summary.next();) {
        if (summary.is(1, Wire::kLengthDelimited)) {
          event.values.push_back(decode_value(summary.bytes()));
        } else {
          summary.skip();
        }
      }
    } else {
      fields.skip();
    }
  }
  return event;
}

// One TFRecord's data at `offset` (tensorflow/core/lib/io/record_reader.cc's framing), both CRCs
// checked; advances `offset` past the record.
std::string_view next_record(std::string_view bytes, size_t& offset) {
  constexpr size_t kHeader = 12, kFooter = 4;
  const size_t left = bytes.size() - offset;
  KILN_CHECK(left >= kHeader, "the file ends within a record's header ({} of its {} bytes)", left, kHeader);
  const std::string_view length_bytes = bytes.substr(offset, 8);
  KILN_CHECK(little_endian(bytes.substr(offset + 8, 4)) == masked_crc32c(length_bytes),
             "the CRC-32C of the record's length does not match");
  const uint64_t length = little_endian(length_bytes);
  KILN_CHECK(length <= left - kHeader && left - kHeader - length >= kFooter,
             "the record holds {} bytes but the file ends {} bytes after its header, cut short", length,
             left - kHeader);
  const std::string_view data = bytes.substr(offset + kHeader, length);
  KILN_CHECK(little_endian(bytes.substr(offset + kHeader + length, 4)) == masked_crc32c(data),
             "the CRC-32C of the record's {} bytes does not match", length);
  offset += kHeader + length + kFooter;
  return data;
}

std::string errno_message() { return std::error_code(errno, std::generic_category()).message(); }

}  // namespace

std::vector<Event> decode_event_file(std::string_view bytes, const std::string& file) {
  std::vector<Event> events;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t record = offset;
    try {
      events.push_back(decode_event(next_record(bytes, offset)));
    } catch (const Error& error) {
      fail("TensorBoard event file '{}' is damaged at byte {} (record {}): {}", file, record, events.size() + 1,
           error.what());
    }
  }
  return events;
}

std::vector<Event> read_event_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "cannot read TensorBoard event file '{}': {}", path, errno_message());
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string reason = got < 0 ? errno_message() : "";
      ::close(fd);
      KILN_CHECK(got == 0, "cannot read TensorBoard event file '{}': {}", path, reason);
      break;
    }
    bytes.append(buffer, static_cast<size_t>(got));
  }
  return decode_event_file(bytes, path);
}

}  // namespace kiln
