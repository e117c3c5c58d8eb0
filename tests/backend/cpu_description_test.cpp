// The CPU back-end's description, which the memory-plan line at the start of a run prints: the
// threads and the OpenBLAS kernels that set the products' speed (docs/training.md, "On the CPU").
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>
#include <string>

#include "kiln/backend/registry.h"

namespace kiln {
namespace {

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

TEST(CpuBackendDescription, NamesTheThreadsAndTheOpenBlasKernels) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  const std::string description = make_backend("cpu")->description();
  omp_set_num_threads(threads);
  std::smatch kernels;
  ASSERT_TRUE(std::regex_match(description, kernels, std::regex(R"(cpu, 3 threads, OpenBLAS (\w+) kernels)")))
      << description;
  // Where the environment chooses OpenBLAS's kernels, those are the ones named.
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  if (chosen && *chosen) {
    EXPECT_EQ(lowercase(kernels[1]), lowercase(chosen)) << description;
  }
}

}  // namespace
}  // namespace kiln
