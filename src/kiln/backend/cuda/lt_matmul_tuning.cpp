#include "kiln/backend/cuda/lt_matmul_tuning.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kiln/backend/cuda/cuda_check.h"
#include "kiln/backend/cuda/stream.h"

namespace kiln::cuda {
namespace {

// The time of a candidate refused when run (time_candidates, lt_matmul_tuning.h).
constexpr float kRefused = std::numeric_limits<float>::infinity();

// The bytes [begin, end) a product touches in one of its arguments.
struct Extent {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Extent& other) const { return begin < other.end && other.begin < end; }
};

Extent bytes_at(const void* pointer, int64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(pointer);
  return {begin, pointer ? begin + static_cast<uintptr_t>(bytes) : begin};
}

// A row-major rows x cols matrix with row stride ld, repeated `batch` times `stride` elements apart.
Extent matrix_at(const void* pointer, DType dtype, int64_t rows, int64_t cols, int64_t ld, int64_t batch = 1,
                 int64_t stride = 0) {
  const int64_t elements = rows > 0 && cols > 0 ? (batch - 1) * stride + (rows - 1) * ld + cols : 0;
  return bytes_at(pointer, elements * static_cast<int64_t>(dtype_size(dtype)));
}

// Destroys the events of one timing.
struct Events {
  explicit Events(size_t count) : events(count, nullptr) {
    for (cudaEvent_t& event : events) check_cuda(cudaEventCreate(&event), "cudaEventCreate (timing products)");
  }
  ~Events() {
    for (cudaEvent_t event : events)
      if (event) cudaEventDestroy(event);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  std::vector<cudaEvent_t> events;
};

}  // namespace

bool product_repeats_exactly(const Gemm& g) {
  const GemmTypes& t = g.types;
  const DType out = t.output;
  const bool bias = g.epilogue == GemmEpilogue::Bias || g.epilogue == GemmEpilogue::GeluAuxBias;
  const bool bias_grad = g.epilogue == GemmEpilogue::BiasGradFromA || g.epilogue == GemmEpilogue::BiasGradFromB;
  const Extent aux = matrix_at(g.aux, out, g.M, g.N, g.aux_ld);
  std::vector<Extent> reads = {
      g.trans_a ? matrix_at(g.A, t.inputs, g.K, g.M, g.lda, g.batch, g.stride_a)
                : matrix_at(g.A, t.inputs, g.M, g.K, g.lda, g.batch, g.stride_a),
      g.trans_b ? matrix_at(g.B, t.b(), g.N, g.K, g.ldb, g.batch, g.stride_b)
                : matrix_at(g.B, t.b(), g.K, g.N, g.ldb, g.batch, g.stride_b),
      bytes_at(g.a_scale, sizeof(float)), bytes_at(g.b_scale, sizeof(float))};
  if (g.beta != 0.0f)
    reads.push_back(matrix_at(g.addend ? g.addend : g.C, out, g.M, g.N, g.ldc, g.batch, g.stride_c));
  if (bias) reads.push_back(bytes_at(g.bias, g.N * static_cast<int64_t>(dtype_size(out))));
  if (g.epilogue == GemmEpilogue::Dgelu) reads.push_back(aux);
  std::vector<Extent> writes = {matrix_at(g.C, out, g.M, g.N, g.ldc, g.batch, g.stride_c)};
  if (g.epilogue == GemmEpilogue::GeluAuxBias) writes.push_back(aux);
  // The bias gradient has M or N fp32 elements (lt_matmul.h); the larger bounds both.
  if (bias_grad) writes.push_back(bytes_at(g.bias_grad, std::max(g.M, g.N) * static_cast<int64_t>(sizeof(float))));
  for (const Extent& written : writes)
    for (const Extent& read : reads)
      if (written.overlaps(read)) return false;
  return true;
}

std::vector<float> time_candidates(size_t count, int rounds, const std::function<bool(size_t)>& run) {
  std::vector<float> fastest(count, kRefused);
  std::vector<size_t> ran;
  for (size_t i = 0; i < count; ++i)  // the warm-up run of each
    if (run(i)) ran.push_back(i);
  if (ran.empty() || rounds < 1) return fastest;
  // Event k marks the end of timed run k (of `ran`'s order, round after round), event 0 the start.
  Events marks(static_cast<size_t>(rounds) * ran.size() + 1);
  const cudaStream_t stream = compute_stream();
  std::vector<bool> refused(count, false);
  size_t next = 0;
  check_cuda(cudaEventRecord(marks.events[next++], stream), "cudaEventRecord (timing products)");
  for (int round = 0; round < rounds; ++round)
    for (size_t i : ran) {
      if (!run(i)) refused[i] = true;
      check_cuda(cudaEventRecord(marks.events[next++], stream), "cudaEventRecord (timing products)");
    }
  check_cuda(cudaEventSynchronize(marks.events.back()), "cudaEventSynchronize (timing products)");
  next = 0;
  for (int round = 0; round < rounds; ++round)
    for (size_t i : ran) {
      float ms = 0.0f;
      check_cuda(cudaEventElapsedTime(&ms, marks.events[next], marks.events[next + 1]),
                 "cudaEventElapsedTime (timing products)");
      ++next;
      fastest[i] = std::min(fastest[i], ms);
    }
  for (size_t i = 0; i < count; ++i)
    if (refused[i]) fastest[i] = kRefused;
  return fastest;
}

std::optional<size_t> chosen_candidate(std::span<const float> times_ms, float margin) {
  if (times_ms.empty()) return std::nullopt;
  const auto fastest = static_cast<size_t>(std::min_element(times_ms.begin(), times_ms.end()) - times_ms.begin());
  if (times_ms[fastest] == kRefused) return std::nullopt;
  if (times_ms[0] == kRefused) return fastest;
  return times_ms[fastest] < times_ms[0] * (1.0f - margin) ? fastest : 0;
}

}  // namespace kiln::cuda
