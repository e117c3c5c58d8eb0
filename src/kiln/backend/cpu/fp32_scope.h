// bf16/fp16 tensors on the CPU back-end. Each CPU op is written once, in fp32; for a bf16 or
// fp16 call, Fp32Scope widens the low-precision arguments into fp32 scratch, the fp32 op runs on
// those views, and write_back() rounds the outputs into the caller's tensors (round to nearest
// even, core/dtype.h). That is exactly the reference semantics ops.h defines for low precision:
// exact inputs, fp32 arithmetic, one rounding per output element. fp32 tensors pass through
// untouched, so the fp32 path costs nothing extra.
//
// Aliasing between an input and an output (gelu_backward's in-place din, residual's out = a) is
// safe: each argument gets its own scratch, and outputs are written back only by write_back(). An
// op that throws never reaches write_back(), so its outputs are left as they were.
#pragma once

#include <cstddef>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

// Conversion buffers a CPU back-end keeps between ops; they grow to the largest op seen, so a
// training loop stops allocating after its first step.
class ConversionScratch {
 public:
  float* take(size_t count);  // a buffer of at least `count` floats, distinct until reset()
  void reset() { used_ = 0; }

 private:
  std::vector<std::vector<float>> buffers_;
  size_t used_ = 0;
};

class Fp32Scope {
 public:
  explicit Fp32Scope(ConversionScratch& scratch) : scratch_(scratch) { scratch_.reset(); }
  Fp32Scope(const Fp32Scope&) = delete;
  Fp32Scope& operator=(const Fp32Scope&) = delete;

  Tensor input(const Tensor& tensor);        // read by the op
  Tensor output(const Tensor& tensor);       // written (=) by the op; starts undefined
  Tensor accumulated(const Tensor& tensor);  // read and written (+=, or in place)
  void write_back();                         // rounds every output into the caller's tensor

 private:
  static bool passes_through(const Tensor& tensor);  // absent, fp32 or integer
  Tensor widened(const Tensor& tensor, bool copy_values);
  struct Pending {
    Tensor fp32, original;
  };
  ConversionScratch& scratch_;
  std::vector<Pending> outputs_;
};

}  // namespace kiln
