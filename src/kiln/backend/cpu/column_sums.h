// The CPU reference's bias gradient: column sums of an output gradient, in a fixed order, shared
// by the products (matmul.cpp) and the attention that casts c_attn's output gradient (attention.cpp).
#pragma once

#include <cstdint>

namespace kiln {

// sums[n] += column n of rows[M, N], each column summed from row 0 up.
void add_column_sums(float* sums, const float* rows, int64_t M, int64_t N);

}  // namespace kiln
