// Softmax + cross-entropy over the (padded) vocabulary, writing the logits' gradient in place, or
// its fp8 codes for the classifier's fp8 backward; one block per row, two passes over it (online
// softmax, then the gradient) instead of three, 16 bytes at a time where the padded row allows;
// the second pass reads the row from shared memory where the first staged it there (below).
// Exponentials are base 2 (exp(x) = 2^(x log2 e)): one multiply-add and one ex2 an element
// (exp2_flushed: no subnormal results, fast_exp2.cuh), and the online softmax rescales its sum once
// a pack of W elements, not once an element.
#include "kiln/backend/cuda/fast_exp2.cuh"
#include "kiln/backend/cuda/fp8_tile.cuh"
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// 1024 threads a block, two blocks an SM: the rows being read at once (264 on an H100's 132 SMs,
// 26 MB at GPT-2's 50,304 bf16 columns) fit the 50 MB L2, so the gradient pass could read its row
// again from L2, not DRAM. With 256-thread blocks, eight an SM, the 1,056 rows in flight (105 MB)
// did not fit, and much of the second pass went to DRAM. On the H100 (2026-11-26) a call over
// 4096 such rows still took 0.38 ms, the time of 1.24 GB at its 3.3 TB/s: read, read again and
// written, as if the second read missed L2 too, under the stream of gradient writes. So where two
// blocks an SM also hold their rows in shared memory (100.6 KB a row of 50,304 bf16 columns, in
// an H100's 228 KB an SM, not an A100's 164) the first pass stages the row there (kStaged).
constexpr int kRowThreads = 1024;
constexpr float kLog2E = 1.44269504088896341f;

// The running (max, sum of exp(x - max)) of an online softmax (Milakov & Gimelshein 2018), so
// one read of the row gives both; merging two states rescales the smaller maximum's sum.
struct SoftmaxState {
  float max = -INFINITY, sum = 0.0f;
  // Adds the first `valid` values of a pack (all W where valid >= W; the rest are columns past the
  // vocabulary), rescaling the sum once for the pack; without branches, so that a thread's loads
  // are not held up behind them.
  template <typename T, int W>
  __device__ void add(const Pack<T, W>& values, int valid) {
    float new_max = max;
#pragma unroll
    for (int w = 0; w < W; ++w) new_max = fmaxf(new_max, w < valid ? values[w] : -INFINITY);
    const float base = new_max == -INFINITY ? 0.0f : new_max * kLog2E;  // nothing seen yet: no -inf - -inf
    float pack_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) pack_sum += w < valid ? exp2_flushed(fmaf(values[w], kLog2E, -base)) : 0.0f;
    sum = sum * exp2_flushed(fmaf(max, kLog2E, -base)) + pack_sum;
    max = new_max;
  }
  __device__ void merge(float other_max, float other_sum) {
    const float merged = fmaxf(max, other_max);
    if (merged == -INFINITY) return;  // both empty
    sum = sum * exp2_flushed((max - merged) * kLog2E) + other_sum * exp2_flushed((other_max - merged) * kLog2E);
    max = merged;
  }
};

// Block-wide merge for blockDim.x == kRowThreads; every thread gets the result.
__device__ SoftmaxState block_merge(SoftmaxState state) {
  __shared__ float maxes[kRowThreads / 32], sums[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1)
    state.merge(__shfl_xor_sync(0xffffffffu, state.max, offset), __shfl_xor_sync(0xffffffffu, state.sum, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    maxes[warp] = state.max;
    sums[warp] = state.sum;
  }
  __syncthreads();
  SoftmaxState total;
  for (int w = 0; w < kRowThreads / 32; ++w) total.merge(maxes[w], sums[w]);  // same order in every thread
  return total;
}

// Max over a block of kRowThreads threads, in thread 0.
__device__ float row_block_max(float value) {
  static_assert(kRowThreads / 32 == 32);  // one warp gathers the warps' maxima
  __shared__ float maxes[kRowThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_max(value);
  if (lane == 0) maxes[warp] = value;
  __syncthreads();
  return warp == 0 ? warp_max(maxes[lane]) : value;
}

// The gradient's fp8 cast (ops.h, SoftmaxCrossEntropy with fp8): codes [M, Vp] written instead of
// the gradient, with the product's scale and amax.
struct GradientCodes {
  uint8_t* codes = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  bool e4m3 = false;
};

// Two passes over the row: the online softmax state, then (with write_grad) the gradient. W
// elements at a time (Pack, element.cuh; Vp is a multiple of W, so a pack never leaves the row).
// The first pass, from DRAM, loads kPacksInFlight packs a thread before using any, so that a
// thread keeps 32 bytes of loads in flight rather than waiting on each pack's exponentials; the
// gradient pass (its row in shared memory or L2) one: more spilled registers at the 32 a thread
// that two blocks of 1024 an SM allow (ptxas, sm_90a: 24 bytes with two, 8 with four in the first
// pass).
constexpr int kPacksInFlight = 2;

// Columns are ints (V and Vp below 2^31: the targets are int32). With kCodes the gradient pass
// writes the gradient's codes (rounded to T first, as stored) into cast.codes and leaves the row as
// it was. With kStaged the first pass also stores each pack in the block's dynamic shared memory
// (Vp elements), and the gradient pass reads them there.
template <typename T, int W, bool kCodes, bool kStaged>
__global__ void __launch_bounds__(kRowThreads, 2)
    cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int V, int Vp, int32_t ignore_index,
                         float loss_scale, bool write_grad, GradientCodes cast) {
  using P = Pack<T, W>;
  constexpr int kStride = kRowThreads * W;  // between a thread's packs
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  T* const staged = reinterpret_cast<T*>(shared);
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int32_t target = targets[row];
  const bool ignored = target == ignore_index;
  const int first = static_cast<int>(threadIdx.x) * W;  // this thread's packs: first, first + kStride, ...

  SoftmaxState state;
  for_each_pack<kPacksInFlight, W>(x, first, kStride, Vp, [&](const P& values, int v) {
    state.add(values, V - v);
    if constexpr (kStaged) values.store(staged + v);
  });
  state = block_merge(state);  // its barrier also completes the staged row
  const T* const row_values = kStaged ? staged : x;  // what the gradient pass reads
  const float log_sum = state.max + logf(state.sum);  // ln of the row's sum of exp(x)
  const float log2_sum = fmaf(state.max, kLog2E, log2f(state.sum));  // and log2
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : log_sum - to_float(x[target]);
  if (!write_grad) return;
  const auto gradient = [&](const P& values, int v, int w) {
    if (ignored || v + w >= V) return 0.0f;
    return (exp2_flushed(fmaf(values[w], kLog2E, -log2_sum)) - (v + w == target ? 1.0f : 0.0f)) * loss_scale;
  };
  if constexpr (kCodes) {
    const float scale = *cast.scale;
    uint8_t* codes = cast.codes + row * Vp;
    float largest = 0.0f;
    for_each_pack<1, W>(row_values, first, kStride, Vp, [&](const P& values, int v) {
      CodePack<W> pack;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float stored = to_float(from_float<T>(gradient(values, v, w)));
        largest = fmaxf(largest, fabsf(stored));
        pack.code[w] = to_fp8(stored * scale, cast.e4m3);
      }
      pack.store(codes + v);
    });
    largest = row_block_max(largest);
    if (threadIdx.x == 0) max_into(cast.amax, largest);
    return;
  }
  __syncthreads();  // the loss read x[target] before it is overwritten
  for_each_pack<1, W>(row_values, first, kStride, Vp, [&](const P& values, int v) {
    P gradients;
#pragma unroll
    for (int w = 0; w < W; ++w) gradients.set(w, gradient(values, v, w));
    gradients.store(x + v);
  });
}

}  // namespace

namespace {
// Whether two blocks an SM fit this GPU with `bytes` of dynamic shared memory each, beside their
// static shared memory and the 1 KB the GPU reserves a block (allowed 2 KB together).
bool two_blocks_an_sm_fit(size_t bytes) {
  int device = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return 2 * (bytes + 2048) <= static_cast<size_t>(per_sm);
}

template <bool kCodes>
int launch_cross_entropy(void* logits, int kind, float* losses, const int32_t* targets, int64_t M, int64_t V,
                         int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad, GradientCodes cast) {
  if (M == 0) return 0;
  if (Vp >= (int64_t{1} << 30)) return static_cast<int>(cudaErrorInvalidValue);  // int columns (above)
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(Vp, {logits, cast.codes}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const size_t row_bytes = static_cast<size_t>(Vp) * sizeof(E);
      const auto staged = cross_entropy_kernel<E, W, kCodes, true>;
      // Two blocks an SM is the point: the carveout is asked to give shared memory all it can (the
      // default leaves the split to the driver).
      bool stage = two_blocks_an_sm_fit(row_bytes) && allow_shared_memory(staged, row_bytes);
      if (stage && cudaFuncSetAttribute(staged, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
        cudaGetLastError();  // refused: the plain form, not an error
        stage = false;
      }
      launch(stage ? staged : cross_entropy_kernel<E, W, kCodes, false>, static_cast<unsigned>(M), kRowThreads,
             stage ? row_bytes : 0, static_cast<E*>(logits), losses, targets, static_cast<int>(V),
             static_cast<int>(Vp), ignore_index, loss_scale, write_grad, cast);
      return launch_status();
    });
  });
}
}  // namespace

int softmax_cross_entropy(void* logits, int kind, float* losses, const int32_t* targets, int64_t M, int64_t V,
                          int64_t Vp, int32_t ignore_index, float loss_scale, bool write_grad) {
  return launch_cross_entropy<false>(logits, kind, losses, targets, M, V, Vp, ignore_index, loss_scale, write_grad,
                                     {});
}

int softmax_cross_entropy_fp8(const void* logits, int kind, float* losses, const int32_t* targets, int64_t M,
                              int64_t V, int64_t Vp, int32_t ignore_index, float loss_scale, const float* scale,
                              float* amax, bool e4m3, uint8_t* codes) {
  if (M % 16 != 0 || Vp % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  return launch_cross_entropy<true>(const_cast<void*>(logits), kind, losses, targets, M, V, Vp, ignore_index,
                                    loss_scale, /*write_grad=*/true, {codes, scale, amax, e4m3});
}

}  // namespace kiln::cuda
