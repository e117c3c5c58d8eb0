// Choosing among cuBLASLt's algorithms for a product by timing them (LtMatmul with autotune on).
// cuBLASLt's heuristic ranks algorithms from a model of the GPU; its first is the fastest "90+% of
// the time" (an NVIDIA engineer in triton-lang/triton issue 3747), and NVIDIA's
// CUDALibrarySamples (cuBLASLt/LtSgemmSimpleAutoTuning) time its top few on the real problem
// instead. LtMatmul does that once per plan: at the plan's first call that can be repeated without
// changing what it computes, it runs each candidate in place on that call's own operands (no
// scratch copies, so no extra memory), keeps the fastest, and runs every later call of the plan
// with it. A plan only ever called accumulating into its
// output (a parameter gradient added to over micro-batches, when its first call already adds)
// keeps the heuristic's first: timing it in place would add its product again at every run.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "kiln/backend/cuda/lt_matmul.h"

namespace kiln::cuda {

// Whether running `g` twice in a row leaves what running it once does: nothing it writes (C, the
// GELU epilogue's aux, the bias gradient) overlaps anything it reads (A, B, the addend when beta is
// not 0, the bias, the GELU gradient's aux, the fp8 factors). False for a product accumulating into
// its output (beta not 0 and no separate addend). Extents are bounded from above, so a doubtful
// case answers false.
bool product_repeats_exactly(const Gemm& g);

// Times `count` ways of running one product, by events on the compute stream: each once to warm up
// (lazy module loading, caches), then `rounds` rounds of one run each, round-robin so that a change
// of clocks during the timing falls on all of them; waits for the last. `run(i)` issues way i on the
// compute stream and returns false when it was refused (nothing issued). Returns each way's fastest
// round in milliseconds; +infinity for a way refused at any run.
std::vector<float> time_candidates(size_t count, int rounds, const std::function<bool(size_t)>& run);

// Which of the timed candidates (the heuristic's order, best first) to keep: the first, unless
// another is faster than it by more than `margin` (a fraction of the first's time, so that timing
// noise does not swap algorithms that are level); the fastest that ran when the first was refused;
// nullopt when none ran.
std::optional<size_t> chosen_candidate(std::span<const float> times_ms, float margin);

}  // namespace kiln::cuda
