// The CPU reference of an op that casts its own output for the next fp8 product, instead of the
// product casting it (ops.h: LayerNormForward with fp8, MatmulForward with gelu_fp8, GeluForward
// with fp8; AttentionBackward with fp8 casts its gradient for the next product's backward).
#pragma once

#include "kiln/backend/cpu/fp32_scope.h"
#include "kiln/backend/ops.h"

namespace kiln {

// `values` (fp32 [M, C], the op's output before rounding) are rounded to `dtype` in place, as the
// op's output would be, and their codes in `format` (F8E4M3 or F8E5M2), fp8(value * scale), written
// into `codes` [M, C] and, transposed, `codes_t` [C, M] (either may be empty); max |value| is folded
// into operand.amax.
void cast_output_to_fp8(const Tensor& values, DType dtype, const Fp8Operand& operand, DType format,
                        const Tensor& codes, const Tensor& codes_t, ConversionScratch& scratch);

}  // namespace kiln
