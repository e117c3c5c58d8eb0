// How the CUDA back-end's LayerNorm backward splits its rows, and the scratch that takes, shared by
// the back-end (cuda/layernorm.cu runs it, CudaBackend reserves it) and `kiln estimate` (which
// predicts it). The backward reads dout and the input once: each block takes a run of rows (and
// a slice of the columns where rows are wider than 2048), writes their input gradients and sums
// their parameter-gradient terms into one row of partial sums per run, for dweight and for dbias;
// column_sums_finish (kernel_common.cuh) adds the runs' rows. The runs depend only on M, so the
// order of addition, and so the bits, do not depend on the GPU. The backward that casts its input
// gradient for an fp8 product takes the fp8 cast's tiles of 32 rows as runs instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/backend/fp8_workspace.h"

namespace kiln {

// 32 rows a run up to 1024 runs, longer runs beyond (M = 64 x 1024, GPT-2 at micro-batch 64: 1024
// runs of 64 rows). With each run's two partial rows written and read back, a run of R rows adds
// 2 / R to the bytes its rows move (3% at 64), while fewer runs would leave an H100's SMs short
// of warps (a run is one block of 4 warps; M = 16 x 1024 gives 512 runs of 32 rows).
constexpr int64_t kLayerNormBackwardRowsPerRun = 32;
constexpr int64_t kLayerNormBackwardMaxRuns = 1024;

inline int64_t layernorm_backward_runs(int64_t M) {
  const int64_t runs = (M + kLayerNormBackwardRowsPerRun - 1) / kLayerNormBackwardRowsPerRun;
  return runs < 1 ? 1 : runs > kLayerNormBackwardMaxRuns ? kLayerNormBackwardMaxRuns : runs;
}

// The partial sums of a backward over M rows of C columns: dweight's then dbias's, a row of C
// floats per run each. With `fp8` (the backward that casts its input gradient, ops.h) the runs are
// the fp8 cast's tiles of rows (fp8_workspace.h), and the product's bias gradient has a third row.
inline size_t layernorm_backward_scratch_bytes(int64_t M, int64_t C, bool fp8 = false) {
  if (fp8) return 3 * fp8_bias_partials_bytes(M, C);
  return 2 * static_cast<size_t>(layernorm_backward_runs(M) * C) * sizeof(float);
}

}  // namespace kiln
