// Fused softmax + cross-entropy over the real vocabulary columns of padded logits. Doing both in
// one pass per row means the probabilities are never stored: with write_grad the logits row is
// overwritten by its own gradient (p - onehot) * loss_scale, or, with fp8, the gradient is cast.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"
#include "kiln/backend/cpu/vector_math.h"

namespace kiln {

namespace {

// The sum of e^(row[v] - shift) over the row, the exponentials taken in the vector units a chunk
// at a time and summed in double: a float running sum over GPT-2's 50,257 columns drops the small
// terms' low bits, about 1e-4 of the sum with logits of standard deviation 4 (and so of every
// probability). Eight partial sums (column v into sum v mod 8, added in a fixed order at the end)
// keep the adds from waiting on each other; the order is the code's, so the bits are the same on
// every machine.
double sum_of_exponentials(const float* row, int64_t count, float shift) {
  constexpr int64_t kChunk = 256, kPartials = 8;  // kChunk a multiple of kPartials
  float chunk[kChunk];
  double partial[kPartials] = {};
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    std::copy_n(row + begin, n, chunk);
    exp_shifted_in_place(chunk, n, shift);
    int64_t i = 0;
    for (; i + kPartials <= n; i += kPartials)
      for (int64_t j = 0; j < kPartials; ++j) partial[j] += chunk[i + j];
    for (; i < n; ++i) partial[i % kPartials] += chunk[i];
  }
  double sum = 0.0;
  for (const double value : partial) sum += value;
  return sum;
}

void softmax_cross_entropy_fp32(const SoftmaxCrossEntropy& args) {
  const auto [M, Vp] = checks::softmax_cross_entropy(args, Device::CPU);
  const int64_t V = args.vocab_size;
  const int32_t* targets = args.targets.as<int32_t>();
  for (int64_t m = 0; m < M; ++m)
    KILN_CHECK(targets[m] == args.ignore_index || (targets[m] >= 0 && targets[m] < V),
               "softmax_cross_entropy: target {} at row {} is outside the vocabulary [0, {})", targets[m], m, V);
  float* logits = args.logits.as<float>();
  float* losses = args.losses.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    float* row = logits + m * Vp;
    const int32_t target = targets[m];
    const bool ignored = target == args.ignore_index;
    float max_logit = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) max_logit = std::max(max_logit, row[v]);
    const float log_sum = static_cast<float>(std::log(sum_of_exponentials(row, V, max_logit))) + max_logit;
    losses[m] = ignored ? 0.0f : log_sum - row[target];
    if (!args.write_grad) continue;
    if (ignored) {
      for (int64_t v = 0; v < Vp; ++v) row[v] = 0.0f;
      continue;
    }
    exp_shifted_in_place(row, V, log_sum);  // the probabilities
    for (int64_t v = 0; v < V; ++v) row[v] = (row[v] - (v == target ? 1.0f : 0.0f)) * args.loss_scale;
    for (int64_t v = V; v < Vp; ++v) row[v] = 0.0f;
  }
}
}  // namespace

// With fp8 the gradient is formed in an fp32 copy of the logits and cast from there (ops.h); the
// logits are only read.
void CpuBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& args) {
  checks::softmax_cross_entropy(args, Device::CPU);
  Fp32Scope f(scratch_);
  const Tensor logits = args.write_grad && !args.fp8 ? f.accumulated(args.logits) : f.input(args.logits);
  softmax_cross_entropy_fp32({logits, args.losses, args.targets, args.vocab_size, args.ignore_index,
                              args.loss_scale, args.write_grad});
  if (args.fp8)
    cast_output_to_fp8(logits, args.logits.dtype, args.fp8->dout, args.fp8->grad_dtype, args.grad_fp8,
                       args.grad_fp8_t, scratch_);
  f.write_back();
}

}  // namespace kiln
