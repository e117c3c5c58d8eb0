// The scratch the CUDA back-end's fp8 products cast their operands into (ops.h, fp8 products):
// forward, `in` [M,K] and the weight as [N,K]; backward, the output gradient [M,N] and its
// transpose, the weight as [K,N] and `in` transposed [K,M] (each only where not given as codes);
// one byte an element, each region 256-byte aligned; then the bias gradient's partial sums. Shared
// by the back-end, which carves its workspace so, the model, which asks for the largest of its
// products (Backend::WorkspaceNeeds::fp8_cast_bytes), and the estimator.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kiln {

inline size_t fp8_region_bytes(int64_t elements) {
  return (static_cast<size_t>(elements) + 255) / 256 * 256;
}

// `weight_codes_given`: the product reads the weight's codes a Convert cast (ops.h, weight_fp8)
// and casts no weight of its own.
inline size_t fp8_forward_cast_bytes(int64_t M, int64_t K, int64_t N, bool weight_codes_given = false) {
  return fp8_region_bytes(M * K) + (weight_codes_given ? 0 : fp8_region_bytes(N * K));
}

// `in_codes_kept`: the backward reads `in`'s codes a forward kept (ops.h, in_fp8_t) and casts no
// `in` of its own; `dout_codes_given`: it reads dout as codes another op cast (ops.h, dout cast
// already) and casts no dout; `weight_codes_given` as above; `din_cast`: it casts din for the
// next product (ops.h, din_reader), the product writing din [M,K] in the 16-bit compute dtype into
// a region of its own first, to be cast from there. The regions are carved in the order above,
// din's first and `in` transposed last.
inline size_t fp8_backward_cast_bytes(int64_t M, int64_t K, int64_t N, bool in_codes_kept,
                                      bool dout_codes_given = false, bool weight_codes_given = false,
                                      bool din_cast = false) {
  return (din_cast ? fp8_region_bytes(2 * M * K) : 0) + (dout_codes_given ? 0 : 2 * fp8_region_bytes(M * N)) +
         (weight_codes_given ? 0 : fp8_region_bytes(K * N)) + (in_codes_kept ? 0 : fp8_region_bytes(K * M));
}

// A backward with a bias gradient sums the output gradient's columns as its cast reads them, one
// float per column for each tile of kFp8CastTileRows rows (fp8.cu), in scratch after the casts.
constexpr int64_t kFp8CastTileRows = 32;
inline int64_t fp8_cast_tile_rows(int64_t M) { return (M + kFp8CastTileRows - 1) / kFp8CastTileRows; }
inline size_t fp8_bias_partials_bytes(int64_t M, int64_t N) {
  return static_cast<size_t>(fp8_cast_tile_rows(M) * N) * sizeof(float);
}

// The op scratch fp8 products need: the largest product's casts (0: no fp8 products), then the
// bias gradient's partial sums for the widest output of M rows.
inline size_t fp8_scratch_bytes(size_t largest_cast_bytes, int64_t M, int64_t widest_N) {
  return largest_cast_bytes > 0 ? largest_cast_bytes + fp8_bias_partials_bytes(M, widest_N) : 0;
}

// What one product's forward and backward need at most.
inline size_t fp8_cast_bytes(int64_t M, int64_t K, int64_t N, bool in_codes_kept = false,
                             bool dout_codes_given = false, bool weight_codes_given = false, bool din_cast = false) {
  return std::max(fp8_forward_cast_bytes(M, K, N, weight_codes_given),
                  fp8_backward_cast_bytes(M, K, N, in_codes_kept, dout_codes_given, weight_codes_given, din_cast));
}

}  // namespace kiln
