// The Chrome trace event format ("Trace Event Format", Google's published specification, the JSON
// that chrome://tracing, Perfetto and TensorBoard's profile plugin open) of one recording
// (core/trace.h): a JSON object whose `traceEvents` hold
//   - metadata ("ph": "M"): the process's name, and each track's name and sort index (threads in
//     the order they were first seen, device tracks after them);
//   - complete events ("ph": "X") with `ts` and `dur` in microseconds (three decimals: the
//     recording's nanoseconds), `cat` the span's category, sorted on each track by start and, for
//     equal starts, longer first, so parents come before the spans nested in them;
//   - counters ("ph": "C"), each sample's value under args.value, on the process.
// `pid` is the process's number (the rank); `tid` a track's id. Times start at `origin_ns`.
// `other_data` (string pairs) goes into the top-level `otherData` object.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/trace.h"

namespace kiln {

struct ChromeTraceProcess {
  int64_t pid = 0;
  std::string name;  // "kiln rank 0 (host)"
  int64_t origin_ns = 0;
  std::map<std::string, std::string> other_data;
};

std::string chrome_trace_json(const std::vector<trace::Track>& tracks, const ChromeTraceProcess& process);

}  // namespace kiln
