// fp8 casts for the fp8 products and the delayed-scaling update (kernels.h, ops.h). A cast reads a
// 32 x 128 tile of the 16-bit input once, 4 elements (8 bytes) a thread, and writes it as 8-bit
// codes in the same layout (4 bytes a thread), in the transposed one through shared memory (16
// bytes a thread), or both (cuBLASLt's fp8 products want both operands K-contiguous, so a
// backward needs the transposes of forward's operands), and folds the tile's max |x| into the
// tensor's amax with one atomic max per block. Rows and columns are multiples of 16 (ops.h).
// Optionally it also sums each tile's columns before the cast (the bias gradient of an fp8
// backward, from the output gradient it casts anyway), into one row of partial sums per tile row,
// which sum_column_partials() then adds in a fixed order, so the bits do not vary. Or it casts
// GELU of the input instead, the GELU op's value as it would store it: the MLP's GELU output from
// its pre-activation, for the second product's fp8 forward or, recomputed, its backward. Or the
// input times GELU's derivative at a second input, as the GELU backward op would store it: the
// gradient of the MLP's pre-activation, for the first product's fp8 backward. And the transpose
// of codes already cast (the logits' gradient, cast by the cross-entropy).
#include "kiln/backend/cuda/fp8_tile.cuh"
#include "kiln/backend/cuda/gelu.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTileRows = kFp8TileRows, kTileColumns = kFp8TileColumns, kVector = kFp8Vector;

// Block (x, y) casts the tile of rows [32 y, 32 y + 32) and columns [128 x, 128 x + 128): warp w
// takes rows w, w + 8, w + 16, w + 24, lane l columns 4 l to 4 l + 3 of each; then the tile's
// transpose is written from shared memory (store_fp8_tile_transposed). With
// column_partials, thread t < 128 then adds tile column t's eight warp sums in warp order into
// column_partials[y][128 x + t]. What is cast (Fp8Source): each value x itself, gelu(x) rounded to
// T, or x gelu'(g) rounded to T, g the same element of gelu_in.
enum class Fp8Source { Input, Gelu, GeluGradient };

template <typename T, Fp8Source kSource>
__global__ void cast_fp8_kernel(const T* in, const T* gelu_in, int64_t rows, int64_t cols, const float* scale_pointer,
                                float* amax, bool e4m3, uint8_t* out, uint8_t* out_t, float* column_partials) {
  constexpr int kWarps = kThreads / 32;
  alignas(16) __shared__ Fp8Tile tile;
  alignas(16) __shared__ float warp_sums[kWarps][kTileColumns];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileRows,
                col0 = static_cast<int64_t>(blockIdx.x) * kTileColumns, col = col0 + lane * kVector;
  // The thread's rows are all loaded before any is cast: kRowsPerWarp loads in flight a thread (twice
  // that with GELU's inputs), not one. As one loop of load and cast, which nvcc did not unroll, each
  // row's load waited out DRAM's latency before the next was issued.
  constexpr int kRowsPerWarp = kTileRows / kWarps;
  static_assert(kTileRows % kWarps == 0);
  using P = Pack<T, kVector>;
  P values[kRowsPerWarp] = {}, at[kRowsPerWarp] = {};  // at: GELU's inputs, for its derivative
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = row0 + warp + i * kWarps;
    if (row >= rows || col >= cols) continue;
    values[i] = P::load(in + row * cols + col);
    if constexpr (kSource == Fp8Source::GeluGradient) at[i] = P::load(gelu_in + row * cols + col);
  }
  const float scale = *scale_pointer;
  float largest = 0.0f, sums[kVector] = {};
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kWarps;
    const int64_t row = row0 + r;
    if (row >= rows || col >= cols) continue;
    uint32_t codes = 0;
#pragma unroll
    for (int v = 0; v < kVector; ++v) {
      float value = values[i][v];
      if constexpr (kSource == Fp8Source::Gelu) value = to_float(from_float<T>(gelu(value)));
      if constexpr (kSource == Fp8Source::GeluGradient)
        value = to_float(from_float<T>(gelu_derivative(at[i][v]) * value));
      largest = fmaxf(largest, fabsf(value));
      sums[v] += value;
      codes |= static_cast<uint32_t>(to_fp8(value * scale, e4m3)) << (8 * v);
    }
    if (out) *reinterpret_cast<uint32_t*>(out + row * cols + col) = codes;
    *reinterpret_cast<uint32_t*>(&tile[r][lane * kVector]) = codes;
  }
  static_assert(kVector == 4);  // one 16-byte store a lane
  *reinterpret_cast<float4*>(&warp_sums[warp][lane * kVector]) = make_float4(sums[0], sums[1], sums[2], sums[3]);
  largest = block_max(largest);  // synchronises the block: the tile and its warp sums are complete
  if (threadIdx.x == 0) max_into(amax, largest);
  if (column_partials && threadIdx.x < kTileColumns && col0 + threadIdx.x < cols) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][threadIdx.x];
    column_partials[blockIdx.y * cols + col0 + threadIdx.x] = total;
  }
  if (out_t) store_fp8_tile_transposed(tile, out_t, row0, col0, rows, cols);
}

// Block (x, y) moves the tile of rows [32 y, 32 y + 32) and columns [128 x, 128 x + 128) of
// codes [rows, cols] into codes_t [cols, rows] through shared memory: thread t loads 16 codes of
// tile row t / 8 and stages them as four 4-byte words (the tile's rows are 132 bytes apart), then
// store_fp8_tile_transposed writes the tile's columns.
__global__ void transpose_fp8_kernel(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t) {
  static_assert(kThreads == kTileRows * kTileColumns / 16);
  alignas(16) __shared__ Fp8Tile tile;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileRows,
                col0 = static_cast<int64_t>(blockIdx.x) * kTileColumns;
  const int r = threadIdx.x / 8, c = threadIdx.x % 8 * 16;
  if (row0 + r < rows && col0 + c < cols) {
    const uint4 piece = *reinterpret_cast<const uint4*>(codes + (row0 + r) * cols + col0 + c);
    auto* staged = reinterpret_cast<uint32_t*>(&tile[r][c]);
    staged[0] = piece.x;
    staged[1] = piece.y;
    staged[2] = piece.z;
    staged[3] = piece.w;
  }
  __syncthreads();
  store_fp8_tile_transposed(tile, codes_t, row0, col0, rows, cols);
}

// One thread per tensor: the rule of ops.h, Fp8UpdateScales, as the CPU reference computes it.
__global__ void fp8_update_scales_kernel(float* state, int64_t tensors, int64_t history_column,
                                         int64_t history, int64_t position, bool use_history_max,
                                         int margin) {
  const int64_t tensor = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tensor >= tensors) return;
  float* r = state + tensor * (history_column + history);
  float* past = r + history_column;
  past[position] = r[2];
  float seen = r[2];
  if (use_history_max)
    for (int64_t i = 0; i < history; ++i) seen = fmaxf(seen, past[i]);
  if (seen < INFINITY && seen > 0.0f) {  // finite and positive (seen is never NaN: fmaxf drops NaN)
    r[0] = ldexpf(r[3] / seen, -margin);
    r[1] = 1.0f / r[0];
  }
  r[2] = 0.0f;
}

}  // namespace

namespace {
template <Fp8Source kSource>
int launch_cast(const void* in, const void* gelu_in, int kind, int64_t rows, int64_t cols, const float* scale,
                float* amax, bool e4m3, uint8_t* out, uint8_t* out_t, float* column_partials) {
  if (rows % 16 != 0 || cols % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0 || cols == 0) return 0;
  const dim3 grid(static_cast<unsigned>((cols + kTileColumns - 1) / kTileColumns),
                  static_cast<unsigned>(fp8_cast_tile_rows(rows)));
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(cast_fp8_kernel<E, kSource>, grid, kThreads, 0, static_cast<const E*>(in),
           static_cast<const E*>(gelu_in), rows, cols, scale, amax, e4m3, out, out_t, column_partials);
    return launch_status();
  });
}
}  // namespace

int cast_fp8(const void* in, int kind, int64_t rows, int64_t cols, const float* scale, float* amax,
             bool e4m3, uint8_t* out, uint8_t* out_t, float* column_partials) {
  return launch_cast<Fp8Source::Input>(in, nullptr, kind, rows, cols, scale, amax, e4m3, out, out_t,
                                       column_partials);
}

int cast_gelu_fp8(const void* in, int kind, int64_t rows, int64_t cols, const float* scale, float* amax,
                  uint8_t* out, uint8_t* out_t) {
  return launch_cast<Fp8Source::Gelu>(in, nullptr, kind, rows, cols, scale, amax, /*e4m3=*/true, out, out_t,
                                      nullptr);
}

int cast_gelu_gradient_fp8(const void* dout, const void* gelu_in, int kind, int64_t rows, int64_t cols,
                           const float* scale, float* amax, bool e4m3, uint8_t* out, uint8_t* out_t,
                           float* column_partials) {
  return launch_cast<Fp8Source::GeluGradient>(dout, gelu_in, kind, rows, cols, scale, amax, e4m3, out, out_t,
                                              column_partials);
}

int transpose_fp8(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t) {
  if (rows % 16 != 0 || cols % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0 || cols == 0) return 0;
  const dim3 grid(static_cast<unsigned>((cols + kTileColumns - 1) / kTileColumns),
                  static_cast<unsigned>(fp8_cast_tile_rows(rows)));
  launch(transpose_fp8_kernel, grid, kThreads, 0, codes, rows, cols, codes_t);
  return launch_status();
}

int fp8_update_scales(float* state, int64_t tensors, int64_t history_column, int64_t history,
                      int64_t position, bool use_history_max, int margin) {
  launch(fp8_update_scales_kernel, blocks_for(tensors), kThreads, 0, state, tensors, history_column,
         history, position, use_history_max, margin);
  return launch_status();
}

}  // namespace kiln::cuda
