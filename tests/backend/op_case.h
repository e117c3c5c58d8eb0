// One op case of the back-end test table (after ggml's test-backend-ops): random float inputs,
// how to run the op forward and backward on a back-end, and a double-precision reference of the
// forward. The table checks forward against the reference and backward against central finite
// differences of the reference (in double, so the oracle is far more precise than fp32).
// Each case runs in every compute dtype (ops.h): its activations are uploaded in that dtype.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::testing {

using FloatInputs = std::vector<std::vector<float>>;
using DoubleInputs = std::vector<std::vector<double>>;

struct OpCase {
  std::string name;
  FloatInputs inputs;                 // random, never zeros
  std::vector<size_t> differentiable; // indices into inputs that have gradients
  // Forward on a back-end in compute dtype `dtype`: the op's main output, flattened.
  std::function<std::vector<float>(Backend&, DType dtype, const FloatInputs&)> forward;
  // The same forward in double precision, written independently of the back-ends.
  std::function<std::vector<double>(const DoubleInputs&)> reference;
  // Backward on a back-end for the scalar L = sum(out * dout): one gradient per differentiable
  // input, in the order of `differentiable`. Empty when the op has no backward.
  std::function<FloatInputs(Backend&, DType dtype, const FloatInputs&, const std::vector<float>& dout)> backward;
  bool uniform_dout = false;  // the op's backward only supports dout = c everywhere (loss ops)
  double forward_tolerance = 1e-5;   // in fp32; bf16 and fp16 use ops_test.cpp's per-dtype bounds
  double backward_tolerance = 1e-4;
};

std::vector<OpCase> all_op_cases();

}  // namespace kiln::testing
