// Whole numbers read from JSON that users or other tools wrote (metadata, checkpoints, headers).
// nlohmann's get<int64_t>() turns a fraction or an out-of-range number into some integer without
// a word (and a double beyond int64's range into undefined behaviour); these refuse them.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kiln/core/error.h"

namespace kiln {

// `value` when it is a whole number in int64's range written as one (no fraction, no exponent).
inline std::optional<int64_t> json_int64(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t number = value.get<uint64_t>();
    if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// object[key] as a whole number in [min, max]; an Error naming `source` and the key when it is
// missing or is not one.
inline int64_t json_int64_at(const nlohmann::json& object, const char* key, int64_t min, int64_t max,
                             const std::string& source) {
  KILN_CHECK(object.is_object() && object.contains(key), "{}: '{}' is missing", source, key);
  const std::optional<int64_t> value = json_int64(object[key]);
  KILN_CHECK(value && *value >= min && *value <= max, "{}: '{}' is {}, not a whole number in [{}, {}]", source, key,
             object[key].dump(), min, max);
  return *value;
}

}  // namespace kiln
