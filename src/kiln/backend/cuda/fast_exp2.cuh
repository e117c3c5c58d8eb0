// 2^x in one instruction, for the exponentials of softmax numerators (attention, cross-entropy).
//
// Without --use_fast_math (kiln builds without it: it would change every kernel's arithmetic),
// exp2f compiles on sm_90 to four instructions: a compare against -126, a conditional halving of
// x, the SFU's ex2 (MUFU.EX2) and a conditional squaring, so that results below 2^-126 come out
// subnormal rather than zero (measured in a cubin's SASS, bench/NOTES.md 2026-11-25, fifth
// session). exp2_flushed is PTX's ex2.approx.ftz.f32: that MUFU.EX2 alone, so the same
// approximation for normal results, with subnormal inputs read as 0 and subnormal results
// written as 0. Callers take it where a result below 2^-126 is worth nothing next to the
// 1 that some other element of the same sum contributes (x <= 0 after subtracting a maximum or a
// log-sum-exp), which is what FlashAttention's kernels get from --use_fast_math.
//
// Built by a host compiler for tests/cuda_emulator, it is std::exp2 with the same flushing.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <limits>

namespace kiln::cuda {

__device__ __forceinline__ float exp2_flushed(float x) {
#if defined(__CUDA_ARCH__)
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
#else
  constexpr float kSmallestNormal = std::numeric_limits<float>::min();
  if (std::fabs(x) < kSmallestNormal) return 1.0f;  // a subnormal (or zero) input reads as 0
  const float result = std::exp2(x);
  return result < kSmallestNormal ? 0.0f : result;
#endif
}

}  // namespace kiln::cuda
