// The bytes of a TensorBoard event file, encoded by hand (no protobuf library): a sequence of
// TFRecords, each holding one serialised tensorflow.Event protocol buffer.
//
// TFRecord framing (tensorflow/core/lib/io/record_writer.h, the format TensorFlow's docs give for
// TFRecord files):
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// all little-endian, the first CRC over the 8 bytes of the length; masked(crc) =
// ((crc >> 15) | (crc << 17)) + 0xa282ead8 (tensorflow/core/lib/hash/crc32c.h, Mask()).
//
// Event (tensorflow/core/util/event.proto) and Summary (tensorflow/core/framework/summary.proto),
// the fields written here:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//             SummaryMetadata metadata = 9; }
// and for text (tensorboard/compat/proto/summary.proto, tensor.proto, tensor_shape.proto, types.proto):
//   SummaryMetadata  { PluginData plugin_data = 1; }
//   PluginData       { string plugin_name = 1; bytes content = 2; }
//   TensorProto      { DataType dtype = 1; TensorShapeProto tensor_shape = 2; repeated bytes string_val = 8; }
//   DataType         DT_STRING = 7
// A file starts with an Event whose file_version is "brain.Event:2"; scalars and texts follow, one
// Event each. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

inline constexpr std::string_view kEventFileVersion = "brain.Event:2";
// TensorBoard's text plugin (tensorboard/plugins/text/metadata.py): its summaries carry this plugin
// name, and as content a TextPluginData of version 0, which serialises to no bytes.
inline constexpr std::string_view kTextPluginName = "text";
inline constexpr uint32_t kDataTypeString = 7;  // DT_STRING

// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78, initial and final value ~0), as iSCSI and
// TFRecord use it: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

// Appends `data` framed as one TFRecord to `out`.
void append_tf_record(std::string& out, std::string_view data);

// Serialised Events: the file's first one, one scalar (a Summary of one Value), and one text (a
// Value whose tensor is a rank-0 DT_STRING holding `text`, with the text plugin's metadata, as the
// plugin's text_pb() writes it; TensorBoard's Text tab renders it as Markdown).
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
std::string encode_text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text);

}  // namespace kiln
