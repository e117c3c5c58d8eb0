// kiln::Error is the one exception type for user-facing failures: bad config, bad data file,
// bad checkpoint, impossible shapes. Its message is a single line that names the culprit (file,
// key, offset) so the command-line front end can print it verbatim and exit non-zero.
// Internal invariant violations use the same type via KILN_CHECK; both are caught in main().
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln

// KILN_CHECK(condition, "format {}", args...): throws kiln::Error with the formatted message.
#define KILN_CHECK(condition, ...)     \
  do {                                 \
    if (!(condition)) {                \
      ::kiln::fail(__VA_ARGS__);       \
    }                                  \
  } while (0)
