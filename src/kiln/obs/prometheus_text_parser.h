// Reading Prometheus's text exposition format 0.0.4 (prometheus.io/docs/instrumenting/
// exposition_formats/), the page `kiln train --metrics-port` serves, back into samples, for
// `kiln top`. One sample a line:
//
//   metric_name [ "{" label_name "=" '"' label_value '"' { "," ... } [ "," ] "}" ] value [
//   timestamp ]
//
// - Lines that start with '#' (HELP, TYPE, other comments) and blank lines hold no sample and are
//   skipped; a histogram is its `_bucket` (with `le`), `_sum` and `_count` samples like any other.
// - Tokens are separated by spaces or tabs; a line's leading and trailing ones are ignored. Names
//   follow the data model: metric names [a-zA-Z_:][a-zA-Z0-9_:]*, label names
//   [a-zA-Z_][a-zA-Z0-9_]*, each label once per sample.
// - Label values unescape \\, \" and \n; any other escape is malformed.
// - Values are decimal numbers with an optional sign and exponent, or NaN, Inf (the format writes
//   +Inf and -Inf) in any case; the optional timestamp is an integer of milliseconds.
//
// Anything else is malformed: a kiln::Error "Prometheus text, line N: <what is wrong>: <the line>"
// (the line cut to 80 characters), so a page that is not Prometheus text is named as such.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

struct PrometheusSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // (name, unescaped value), as written
  double value = 0;
  std::optional<int64_t> timestamp_ms;

  // The value of the label called `label_name`; nullptr when the sample has none.
  const std::string* label(std::string_view label_name) const;
};

// Every sample of `text`, in its order.
std::vector<PrometheusSample> parse_prometheus_text(std::string_view text);

}  // namespace kiln
