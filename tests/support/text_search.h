// Searching a test's output text (an HTML page, an SVG chart): how often a fragment occurs, and
// whether it does.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::testing {

// Occurrences of `what` in `text`, overlapping ones included.
inline size_t count(const std::string& text, const std::string& what) {
  size_t found = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++found;
  return found;
}

inline bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace kiln::testing
