// The back-ends the parameterised tests run on, and why one is skipped on this machine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/registry.h"

namespace kiln::testing {

inline std::vector<std::string> all_backend_names() { return {"cpu", "cuda"}; }

// Empty when `name` can run here, else the reason it cannot (shown by GTEST_SKIP).
inline std::string backend_skip_reason(const std::string& name) {
  if (name == "cpu") return "";
  try {
    make_backend(name);
    return "";
  } catch (const std::exception& error) {
    return error.what();
  }
}

}  // namespace kiln::testing
