#include "kiln/obs/tensorboard_format.h"

#include <array>
#include <bit>

namespace kiln {
namespace {

// CRC-32C by a 256-entry table, one byte a step. Our own because Debian 12 packages no C or C++
// CRC-32C library (`apt-cache search crc32c` finds only python3-crc32c; Google's crc32c is not
// packaged). A few hundred bytes an iteration, on the writer thread: speed does not matter here.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

// Protocol buffer wire format (protobuf.dev/programming-guides/encoding): a key is
// (field number << 3) | wire type; varints carry 7 bits a byte, low bits first.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7Fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void append_key(std::string& out, uint32_t field, WireType type) { append_varint(out, (field << 3) | type); }

void append_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  append_key(out, field, kLengthDelimited);
  append_varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields 1 and 2, which every event written here carries.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  append_key(event, 1, kFixed64);
  append_little_endian(event, std::bit_cast<uint64_t>(wall_time), 8);
  append_key(event, 2, kVarint);
  append_varint(event, static_cast<uint64_t>(step));  // int64: negatives as ten-byte two's complement
  return event;
}

// An Event of `wall_time` and `step` whose Summary holds the one Value `summary_value`.
std::string summary_event(double wall_time, int64_t step, std::string_view summary_value) {
  std::string summary;
  append_bytes_field(summary, 1, summary_value);
  std::string event = event_header(wall_time, step);
  append_bytes_field(event, 5, summary);
  return event;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = ~0u;
  for (const char byte : bytes) crc = (crc >> 8) ^ kCrc32cTable[(crc ^ static_cast<uint8_t>(byte)) & 0xFFu];
  return ~crc;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void append_tf_record(std::string& out, std::string_view data) {
  std::string length;
  append_little_endian(length, data.size(), 8);
  out += length;
  append_little_endian(out, masked_crc32c(length), 4);
  out.append(data);
  append_little_endian(out, masked_crc32c(data), 4);
}

std::string encode_file_version_event(double wall_time) {
  std::string event = event_header(wall_time, 0);
  append_bytes_field(event, 3, kEventFileVersion);
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  append_bytes_field(summary_value, 1, tag);
  append_key(summary_value, 2, kFixed32);
  append_little_endian(summary_value, std::bit_cast<uint32_t>(value), 4);
  return summary_event(wall_time, step, summary_value);
}

std::string encode_text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text) {
  std::string plugin_data;
  append_bytes_field(plugin_data, 1, kTextPluginName);  // content: TextPluginData{version 0}, no bytes
  std::string metadata;
  append_bytes_field(metadata, 1, plugin_data);
  std::string tensor;
  append_key(tensor, 1, kVarint);
  append_varint(tensor, kDataTypeString);
  append_bytes_field(tensor, 2, "");  // a TensorShapeProto with no dims: rank 0
  append_bytes_field(tensor, 8, text);
  std::string summary_value;
  append_bytes_field(summary_value, 1, tag);
  append_bytes_field(summary_value, 8, tensor);
  append_bytes_field(summary_value, 9, metadata);
  return summary_event(wall_time, step, summary_value);
}

}  // namespace kiln
