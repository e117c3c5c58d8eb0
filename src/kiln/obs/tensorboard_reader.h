// Reading a TensorBoard event file back (the format of tensorboard_format.h): each TFRecord's two
// masked CRC-32Cs are checked, and its data is decoded as a tensorflow.Event. Of each Summary Value
// it keeps the tag, the simple_value of a scalar and the string of a text-plugin summary; values of
// other kinds (images, histograms, other plugins' tensors) keep their tag alone. Fields it does not
// know are skipped, as protocol buffers allow.
//
// Any damage (a record cut short, a CRC that does not match, a message that runs past its end) is
// a kiln::Error naming the file and the byte offset of the record; an unreadable file is one naming
// the file. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct EventValue {
  std::string tag;
  std::optional<float> simple_value;  // a scalar
  std::optional<std::string> text;    // a text-plugin summary's string
};

struct Event {
  double wall_time = 0;  // seconds since 1970
  int64_t step = 0;
  std::string file_version;  // the first Event's "brain.Event:2"; empty in the others
  std::vector<EventValue> values;
};

// Every Event of `bytes`, an event file's contents; `file` names it in errors.
std::vector<Event> decode_event_file(std::string_view bytes, const std::string& file);
std::vector<Event> read_event_file(const std::string& path);

}  // namespace kiln
