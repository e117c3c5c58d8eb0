// A reader of TensorBoard event files written for the tests from the published formats, sharing no
// code with kiln's writer: TFRecord frames (length, masked CRC-32C of the length, data, masked
// CRC-32C of the data; tensorflow/core/lib/io/record_reader.cc), protocol-buffer wire format
// (protobuf.dev/programming-guides/encoding), tensorflow.Event (event.proto) and Summary
// (summary.proto), with the text plugin's values (SummaryMetadata.plugin_data.plugin_name and a
// DT_STRING TensorProto, tensor.proto). Its CRC-32C is bitwise, not kiln's table. A malformed file fails the test that
// reads it (a thrown std::runtime_error naming the offset).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "support/temp_dir.h"

namespace kiln::testing {

inline uint32_t bitwise_crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char byte : bytes) {
    crc ^= static_cast<uint8_t>(byte);
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return crc ^ 0xFFFFFFFFu;
}

inline uint32_t tf_record_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

struct ScalarValue {
  std::string tag;
  float value = 0;
};

// A Summary.Value with a tensor: its plugin and the tensor's dtype and string_vals.
struct TensorValue {
  std::string tag;
  std::string plugin_name;  // metadata.plugin_data.plugin_name
  uint64_t dtype = 0;       // 7: DT_STRING
  bool has_shape = false;   // tensor_shape present (with no dims: rank 0)
  uint64_t shape_dims = 0;
  std::vector<std::string> strings;  // string_val
};

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;          // empty unless field 3 is present
  std::vector<ScalarValue> scalars;  // Summary.value entries with a simple_value
  std::vector<TensorValue> tensors;  // Summary.value entries with a tensor
};

// Protocol buffer fields of one message, read in order.
class ProtoFields {
 public:
  explicit ProtoFields(std::string_view message) : rest_(message) {}
  bool next(uint32_t& field, uint32_t& wire_type) {
    if (rest_.empty()) return false;
    const uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    wire_type = static_cast<uint32_t>(key & 7u);
    return true;
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto byte = static_cast<uint8_t>(take(1)[0]);
      value |= static_cast<uint64_t>(byte & 0x7Fu) << shift;
      if ((byte & 0x80u) == 0) return value;
    }
    throw std::runtime_error("varint longer than ten bytes");
  }
  uint64_t fixed(size_t bytes) {
    uint64_t value = 0;
    const std::string_view raw = take(bytes);
    for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
    return value;
  }
  std::string_view length_delimited() { return take(static_cast<size_t>(varint())); }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: take(8); return;
      case 2: length_delimited(); return;
      case 5: take(4); return;
      default: throw std::runtime_error("unknown wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view take(size_t bytes) {
    if (bytes > rest_.size()) throw std::runtime_error("protocol buffer field runs past its message");
    const std::string_view taken = rest_.substr(0, bytes);
    rest_.remove_prefix(bytes);
    return taken;
  }
  std::string_view rest_;
};

// The bytes of the length-delimited field at `path`, field numbers from the outer message in.
inline std::string nested_string(std::string_view message, std::vector<uint32_t> path) {
  ProtoFields fields(message);
  for (uint32_t field = 0, type = 0; fields.next(field, type);) {
    if (field == path.front() && type == 2) {
      const std::string_view inner = fields.length_delimited();
      if (path.size() == 1) return std::string(inner);
      return nested_string(inner, std::vector<uint32_t>(path.begin() + 1, path.end()));
    }
    fields.skip(type);
  }
  return "";
}

inline void decode_tensor(std::string_view message, TensorValue& tensor) {
  ProtoFields fields(message);
  for (uint32_t field = 0, type = 0; fields.next(field, type);) {
    if (field == 1 && type == 0) {
      tensor.dtype = fields.varint();
    } else if (field == 2 && type == 2) {
      tensor.has_shape = true;
      ProtoFields shape(fields.length_delimited());
      for (uint32_t inner = 0, inner_type = 0; shape.next(inner, inner_type);) {
        tensor.shape_dims += inner == 2;
        shape.skip(inner_type);
      }
    } else if (field == 8 && type == 2) {
      tensor.strings.emplace_back(fields.length_delimited());
    } else {
      fields.skip(type);
    }
  }
}

inline void decode_summary_value(std::string_view message, DecodedEvent& event) {
  std::string tag;
  std::optional<float> simple_value;
  std::optional<TensorValue> tensor;
  std::string plugin_name;
  ProtoFields fields(message);
  for (uint32_t field = 0, type = 0; fields.next(field, type);) {
    if (field == 1 && type == 2) {
      tag = fields.length_delimited();
    } else if (field == 2 && type == 5) {
      simple_value = std::bit_cast<float>(static_cast<uint32_t>(fields.fixed(4)));
    } else if (field == 8 && type == 2) {
      decode_tensor(fields.length_delimited(), tensor.emplace());
    } else if (field == 9 && type == 2) {
      plugin_name = nested_string(fields.length_delimited(), {1, 1});  // plugin_data.plugin_name
    } else {
      fields.skip(type);
    }
  }
  if (simple_value) event.scalars.push_back({tag, *simple_value});
  if (tensor) {
    tensor->tag = tag;
    tensor->plugin_name = plugin_name;
    event.tensors.push_back(std::move(*tensor));
  }
}

inline DecodedEvent decode_event(std::string_view message) {
  DecodedEvent event;
  ProtoFields fields(message);
  for (uint32_t field = 0, type = 0; fields.next(field, type);) {
    if (field == 1 && type == 1) {
      event.wall_time = std::bit_cast<double>(fields.fixed(8));
    } else if (field == 2 && type == 0) {
      event.step = static_cast<int64_t>(fields.varint());
    } else if (field == 3 && type == 2) {
      event.file_version = fields.length_delimited();
    } else if (field == 5 && type == 2) {
      ProtoFields summary(fields.length_delimited());
      for (uint32_t inner = 0, inner_type = 0; summary.next(inner, inner_type);) {
        if (inner == 1 && inner_type == 2) {
          decode_summary_value(summary.length_delimited(), event);
        } else {
          summary.skip(inner_type);
        }
      }
    } else {
      fields.skip(type);
    }
  }
  return event;
}

// Every record of `bytes`, both CRCs checked.
inline std::vector<DecodedEvent> decode_event_records(std::string_view bytes) {
  std::vector<DecodedEvent> events;
  size_t offset = 0;
  const auto little_endian = [&](size_t at, size_t width) {
    uint64_t value = 0;
    for (size_t i = 0; i < width; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
    return value;
  };
  while (offset < bytes.size()) {
    const std::string where = " at offset " + std::to_string(offset);
    if (bytes.size() - offset < 12) throw std::runtime_error("truncated record header" + where);
    const uint64_t length = little_endian(offset, 8);
    if (little_endian(offset + 8, 4) != tf_record_mask(bitwise_crc32c(bytes.substr(offset, 8))))
      throw std::runtime_error("bad length CRC" + where);
    if (bytes.size() - offset - 12 < length + 4) throw std::runtime_error("truncated record data" + where);
    const std::string_view data = bytes.substr(offset + 12, length);
    if (little_endian(offset + 12 + length, 4) != tf_record_mask(bitwise_crc32c(data)))
      throw std::runtime_error("bad data CRC" + where);
    events.push_back(decode_event(data));
    offset += 12 + length + 4;
  }
  return events;
}

inline std::vector<DecodedEvent> read_event_file(const std::string& path) {
  return decode_event_records(read_file_bytes(path));
}

// The event files of a folder, sorted by name (which starts with the creation time in seconds).
inline std::vector<std::string> event_files_in(const std::string& folder) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (entry.path().filename().string().starts_with("events.out.tfevents.")) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// tag -> (step -> value) over the scalar events of `events`.
using ScalarSeries = std::map<std::string, std::map<int64_t, float>>;

inline ScalarSeries scalar_series(const std::vector<DecodedEvent>& events) {
  ScalarSeries series;
  for (const DecodedEvent& event : events)
    for (const ScalarValue& scalar : event.scalars) series[scalar.tag][event.step] = scalar.value;
  return series;
}

// tag -> (step -> text) over the text-plugin summaries of `events`: a rank-0 DT_STRING tensor.
using TextSeries = std::map<std::string, std::map<int64_t, std::string>>;

inline TextSeries text_series(const std::vector<DecodedEvent>& events) {
  TextSeries series;
  for (const DecodedEvent& event : events)
    for (const TensorValue& tensor : event.tensors)
      if (tensor.plugin_name == "text" && tensor.dtype == 7 && tensor.has_shape && tensor.shape_dims == 0 &&
          tensor.strings.size() == 1)
        series[tensor.tag][event.step] = tensor.strings[0];
  return series;
}

}  // namespace kiln::testing
