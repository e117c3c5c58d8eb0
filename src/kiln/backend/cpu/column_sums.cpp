#include "kiln/backend/cpu/column_sums.h"

#include <algorithm>

namespace kiln {

void add_column_sums(float* sums, const float* rows, int64_t M, int64_t N) {
  constexpr int64_t kColumnBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t n0 = 0; n0 < N; n0 += kColumnBlock) {
    const int64_t n1 = std::min(N, n0 + kColumnBlock);
    float block[kColumnBlock] = {};
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) block[n - n0] += rows[m * N + n];
    for (int64_t n = n0; n < n1; ++n) sums[n] += block[n - n0];
  }
}

}  // namespace kiln
