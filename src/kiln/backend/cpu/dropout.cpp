// Dropout (ops.h): the mask from Philox's bits of each element, as every back-end draws it.
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/op_checks.h"
#include "kiln/core/philox.h"

namespace kiln {

void CpuBackend::dropout(const Dropout& args) {
  const int64_t count = checks::dropout(args, Device::CPU);
  Fp32Scope f(scratch_);
  const Tensor out = f.output(args.out), in = f.input(args.in);
  const uint64_t threshold = dropout_threshold(args.probability);
  const float scale = 1.0f / (1.0f - args.probability);
  const float* x = in.as<float>();
  float* y = out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i)
    y[i] = philox::bits(args.seed, args.stream, static_cast<uint64_t>(i)) >= threshold ? x[i] * scale : 0.0f;
  f.write_back();
}

}  // namespace kiln
