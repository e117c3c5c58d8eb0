// Dropout (ops.h): the mask from Philox's bits of each element, as every back-end draws it, one
// Philox block for four neighbouring elements; with a residual, the fused dropout-add.
#include <algorithm>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"
#include "kiln/core/philox.h"

namespace kiln {

void CpuBackend::dropout(const Dropout& args) {
  const int64_t count = checks::dropout(args, Device::CPU);
  Fp32Scope f(scratch_);
  const Tensor out = f.output(args.out), in = f.input(args.in);
  const float* residual = args.residual.empty() ? nullptr : f.input(args.residual).as<float>();
  const uint64_t threshold = dropout_threshold(args.probability);
  const float scale = 1.0f / (1.0f - args.probability);
  const float* x = in.as<float>();
  float* y = out.as<float>();
  const int64_t blocks = (count + 3) / 4;
  const bool keep_all = threshold == 0;  // p = 0 (an add with a residual): no bits to draw
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const philox::Words bits = keep_all ? philox::Words{} : philox::block(args.seed, args.stream, static_cast<uint64_t>(b));
    for (int64_t i = 4 * b; i < std::min(4 * b + 4, count); ++i) {
      const float kept = bits.w[i & 3] >= threshold ? x[i] * scale : 0.0f;
      y[i] = residual ? residual[i] + kept : kept;
    }
  }
  f.write_back();
}

}  // namespace kiln
