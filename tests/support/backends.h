// The back-ends the parameterised tests run on, and why one is skipped on this machine.
#pragma once

#include <gtest/gtest.h>

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

// A fixture for tests run once per back-end (instantiated with all_backend_names()): skipped with
// the reason where the back-end cannot run here, else given a fresh one in backend_.
class OnEachBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
    backend_ = make_backend(GetParam());
  }
  std::unique_ptr<Backend> backend_;
};

// Names the instances of such a test by their back-end ("cpu", "cuda") instead of a number.
inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

}  // namespace kiln::testing
