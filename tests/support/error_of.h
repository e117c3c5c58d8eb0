// error_of(action): runs `action` and returns the kiln::Error message it throws, or "" when it
// does not throw, so tests can assert on what a user would read.
#pragma once

#include <string>

#include "kiln/core/error.h"

namespace kiln::testing {

template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace kiln::testing
