// Token + position embedding (kernels.h, ops.h). Backward is deterministic without atomics: token
// rows are reduced after a stable radix sort of the positions by token.
#include <cub/device/device_radix_sort.cuh>

#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// A thread a pack of W columns (C a multiple of W): 16-byte accesses where the rows allow, where one
// element a thread moved 2 bytes an access (the H100 profile of 2026-11-26: 1.0 TB/s).
template <typename T, int W>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t T_,
                                         int64_t C, int64_t packs) {
  using P = Pack<T, W>;
  GRID_STRIDE(p, packs) {
    const int64_t i = p * W, position = i / C, c = i % C;
    const P token = P::load(wte + tokens[position] * C + c), place = P::load(wpe + (position % T_) * C + c);
    P sum;
#pragma unroll
    for (int w = 0; w < W; ++w) sum.set(w, token[w] + place[w]);
    sum.store(out + i);
  }
}

// dwte without atomics: positions arrive sorted by token (stable, so in position order within a
// token), and each run of equal tokens is added into its token's row by one warp or one block, in
// an order that depends only on the run's length. Most runs are a row or two; in real text the
// commonest tokens make runs of hundreds or thousands (a token that is 1% of the text has 655 rows
// in a 64 x 1024 micro-batch), and the slowest run sets the kernel's time. So two kernels:
// - runs of up to kShortRun rows: a warp each (short_runs_kernel), small enough that many warps
//   are resident to hide the few dependent loads of each;
// - longer runs: a block of kLongWarps warps each (long_runs_kernel), each warp taking chunks of
//   32 rows in turn and keeping kLongRowsInFlight rows of loads in flight, the warps' sums then
//   added in warp order through shared memory.
// A lane takes kRunPacks packs of W columns of a row at a time (columns in groups of 32 W
// kRunPacks); a chunk's 32 positions are read in one load and passed by shuffles; a run's ends are
// found by a warp probing 32 positions at once (past_run), where a binary search over all
// positions made 16 dependent loads for every run.
constexpr int kShortRun = 64;  // rows; a warp adds one row at a time, so at most 64 round trips
constexpr int kRunPacks = 4;
constexpr int kLongWarps = 8;
constexpr int kLongRowsInFlight = 4;

// The first position past the run of `token` that holds `from`, going in `direction` (+1 or -1;
// -1 or `positions` where the run reaches the end), for every lane of a warp alike: the lanes
// probe from + direction (l + 1) stride for strides 1, 32, 1024, ... until a probe leaves the run,
// then narrow the interval that holds its edge by 32 a round.
__device__ int64_t past_run(const int32_t* sorted_tokens, int64_t positions, int64_t from, int32_t token,
                            int direction, int lane) {
  int64_t inside = from, stride = 1;  // sorted_tokens[inside] == token
  bool growing = true;
  for (;;) {
    const int64_t probe = inside + direction * (lane + 1) * stride;
    const bool outside = probe < 0 || probe >= positions || sorted_tokens[probe] != token;
    int first = outside ? lane : 32;  // the first lane whose probe left the run
    for (int offset = 16; offset > 0; offset >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
    if (first == 32 && growing) {  // (never once narrowing: the interval's far end is outside)
      inside += direction * 32 * stride;
      stride *= 32;
      continue;
    }
    growing = false;
    if (stride == 1) return inside + direction * (first + 1);
    inside += direction * first * stride;  // the edge is within `stride` past it
    stride /= 32;
  }
}

// Adds rows [begin, end) of a run (positions sorted_positions[begin..end)) into a lane's sums of
// its columns c0 + W (32 p + lane) + [0, W), p < kRunPacks: warp `warp` of `warps` takes the
// chunks of 32 rows warp, warp + warps, ..., each in order, loading kRowsInFlight rows before
// adding them.
template <typename T, int W, int kRowsInFlight>
__device__ void add_rows(float (&sums)[kRunPacks][W], const T* dout, const int32_t* sorted_positions, int64_t begin,
                         int64_t end, int64_t C, int64_t c0, int warp, int warps, int lane) {
  using P = Pack<T, W>;
  const int64_t chunk_stride = 32 * static_cast<int64_t>(warps);
  for (int64_t chunk = begin + 32 * static_cast<int64_t>(warp); chunk < end; chunk += chunk_stride) {
    const int rows = end - chunk < 32 ? static_cast<int>(end - chunk) : 32;
    const int32_t my_position = lane < rows ? sorted_positions[chunk + lane] : 0;
    for (int r0 = 0; r0 < rows; r0 += kRowsInFlight) {
      P values[kRowsInFlight][kRunPacks] = {};  // (initialised: fewer registers than without, in ptxas 13.0)
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const T* row = dout + static_cast<int64_t>(__shfl_sync(0xffffffffu, my_position, (r0 + r) % 32)) * C;
#pragma unroll
        for (int p = 0; p < kRunPacks; ++p)
          if (r0 + r < rows && c0 + static_cast<int64_t>(p * 32 + lane) * W < C)
            values[r][p] = P::load(row + c0 + static_cast<int64_t>(p * 32 + lane) * W);
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r)
#pragma unroll
        for (int p = 0; p < kRunPacks; ++p)
          if (r0 + r < rows && c0 + static_cast<int64_t>(p * 32 + lane) * W < C)
#pragma unroll
            for (int w = 0; w < W; ++w) sums[p][w] += values[r][p][w];
    }
  }
}

// dwte[token, c] += a lane's sums, for its columns c of the group at c0.
template <int W>
__device__ void add_into_row(float* dwte_row, const float (&sums)[kRunPacks][W], int64_t C, int64_t c0, int lane) {
#pragma unroll
  for (int p = 0; p < kRunPacks; ++p) {
    const int64_t c = c0 + static_cast<int64_t>(p * 32 + lane) * W;
    if (c < C)
#pragma unroll
      for (int w = 0; w < W; ++w) dwte_row[c + w] += sums[p][w];
  }
}

// Warp v of block b takes position 8 b + v where a run of at most kShortRun rows starts there.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    short_runs_kernel(float* dwte, const T* dout, const int32_t* sorted_tokens, const int32_t* sorted_positions,
                      int64_t positions, int64_t C) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t start = blockIdx.x * static_cast<int64_t>(kThreads / 32) + threadIdx.x / 32;
  if (start >= positions || (start > 0 && sorted_tokens[start] == sorted_tokens[start - 1])) return;
  const int32_t token = sorted_tokens[start];
  const int64_t end = past_run(sorted_tokens, positions, start, token, 1, lane);
  if (end - start > kShortRun) return;  // long_runs_kernel's
  for (int64_t c0 = 0; c0 < C; c0 += 32 * W * kRunPacks) {
    float sums[kRunPacks][W] = {};
    add_rows<T, W, 1>(sums, dout, sorted_positions, start, end, C, c0, 0, 1, lane);
    add_into_row<W>(dwte + token * C, sums, C, c0, lane);
  }
}

// Block b takes the run that holds position kShortRun b where it is longer than kShortRun and
// starts after position kShortRun (b - 1) (so each long run, which holds at least one multiple of
// kShortRun, is taken once).
template <typename T, int W>
__global__ void __launch_bounds__(32 * kLongWarps, 1)
    long_runs_kernel(float* dwte, const T* dout, const int32_t* sorted_tokens, const int32_t* sorted_positions,
                     int64_t positions, int64_t C) {
  __shared__ float partials[kLongWarps - 1][kRunPacks * W][32];  // warps 1, 2, ...: [pack, element][lane]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t held = blockIdx.x * static_cast<int64_t>(kShortRun);
  const int32_t token = sorted_tokens[held];
  const int64_t start = past_run(sorted_tokens, positions, held, token, -1, lane) + 1;
  const int64_t end = past_run(sorted_tokens, positions, held, token, 1, lane);
  if (end - start <= kShortRun || start <= held - kShortRun) return;  // short_runs_kernel's, or another block's
  for (int64_t c0 = 0; c0 < C; c0 += 32 * W * kRunPacks) {
    float sums[kRunPacks][W] = {};
    add_rows<T, W, kLongRowsInFlight>(sums, dout, sorted_positions, start, end, C, c0, warp, kLongWarps, lane);
    if (warp > 0)
#pragma unroll
      for (int p = 0; p < kRunPacks; ++p)
#pragma unroll
        for (int w = 0; w < W; ++w) partials[warp - 1][p * W + w][lane] = sums[p][w];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int p = 0; p < kRunPacks; ++p)
#pragma unroll
        for (int w = 0; w < W; ++w)
          for (int k = 0; k < kLongWarps - 1; ++k) sums[p][w] += partials[k][p * W + w][lane];
      add_into_row<W>(dwte + token * C, sums, C, c0, lane);
    }
    __syncthreads();  // before the next group's sums overwrite the partials
  }
}

// dwpe[t] += sum over the batch of dout[b, t], in batch order; with `write`, = instead, over all
// `rows` rows of dwpe, the ones past T_ (no position there) zero.
template <typename T>
__global__ void embedding_backward_positions_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C,
                                                    int64_t rows, bool write) {
  GRID_STRIDE(i, (write ? rows : T_) * C) {
    float sum = 0.0f;
    if (i < T_ * C)
      for (int64_t b = 0; b < B; ++b) sum += to_float(dout[b * T_ * C + i]);
    dwpe[i] = write ? sum : dwpe[i] + sum;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t count) {
  GRID_STRIDE(i, count) out[i] = static_cast<int32_t>(i);
}

}  // namespace

int embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int kind, int64_t B,
                      int64_t T, int64_t C) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {out, wte, wpe}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t packs = B * T * C / W;
      launch(embedding_forward_kernel<E, W>, blocks_for(packs), kThreads, 0, static_cast<E*>(out), tokens,
             static_cast<const E*>(wte), static_cast<const E*>(wpe), T, C, packs);
      return launch_status();
    });
  });
}

size_t embedding_backward_workspace_bytes(int64_t positions) {
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(positions));
  return 3 * static_cast<size_t>(positions) * sizeof(int32_t) + sort_bytes + 256;
}

int embedding_backward(float* dwte, float* dwpe, const void* dout, int kind, const int32_t* tokens, int64_t B,
                       int64_t T, int64_t C, int64_t dwpe_rows, bool write_dwpe, void* workspace,
                       size_t workspace_bytes) {
  const int64_t positions = B * T;
  auto* positions_in = static_cast<int32_t*>(workspace);
  int32_t* sorted_tokens = positions_in + positions;
  int32_t* sorted_positions = sorted_tokens + positions;
  void* sort_storage = sorted_positions + positions;
  size_t sort_bytes = workspace_bytes - 3 * static_cast<size_t>(positions) * sizeof(int32_t);
  launch(iota_kernel, blocks_for(positions), kThreads, 0, positions_in, positions);
  {
    const TimedLaunch timed("CUB radix sort");
    if (const cudaError_t status = cub::DeviceRadixSort::SortPairs(
            sort_storage, sort_bytes, tokens, sorted_tokens, positions_in, sorted_positions,
            static_cast<int>(positions), 0, static_cast<int>(sizeof(int32_t) * 8), compute_stream()))
      return static_cast<int>(status);
  }
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    const E* grad = static_cast<const E*>(dout);
    const int status = with_pack_width<E>(C, {dout}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(short_runs_kernel<E, W>, static_cast<unsigned>((positions + kThreads / 32 - 1) / (kThreads / 32)),
             kThreads, 0, dwte, grad, sorted_tokens, sorted_positions, positions, C);
      launch(long_runs_kernel<E, W>, static_cast<unsigned>((positions + kShortRun - 1) / kShortRun), 32 * kLongWarps,
             0, dwte, grad, sorted_tokens, sorted_positions, positions, C);
      return launch_status();
    });
    if (status != 0) return status;
    launch(embedding_backward_positions_kernel<E>, blocks_for((write_dwpe ? dwpe_rows : T) * C), kThreads, 0, dwpe,
           grad, B, T, C, dwpe_rows, write_dwpe);
    return launch_status();
  });
}

}  // namespace kiln::cuda
