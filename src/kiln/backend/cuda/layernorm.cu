// LayerNorm forward, one warp per row, or, for an output only an fp8 product reads, 32 rows a
// block casting it to fp8 codes in the same pass; and backward, one warp per row with the
// parameter gradients summed in the same pass into partial sums a run of rows
// (layernorm_workspace.h), which take the workspace, or, for an input gradient an fp8 product's
// backward reads next, 32 rows a block also casting it, with that product's bias gradient.
#include "kiln/backend/cuda/fp8_tile.cuh"
#include "kiln/backend/layernorm_workspace.h"

namespace kiln::cuda {
namespace {

// One warp per row, kRowsPerBlock rows per block: the row's statistics need only warp shuffles (no
// block barriers), and a block of 256 threads keeps eight rows in flight where one row per block
// kept one. Every loop strides over the same columns per lane, so each lane reads back only what
// it wrote.
constexpr int kRowsPerBlock = kThreads / 32;

inline unsigned row_blocks(int64_t M) { return static_cast<unsigned>((M + kRowsPerBlock - 1) / kRowsPerBlock); }

// Columns move W at a time (Pack, element.cuh; C is a multiple of W): lane l takes columns
// [W (l + 32 i), W (l + 32 i) + W). The pieces below are shared by the plain forward and the one
// that casts its output to fp8, so the two give the same bits.

struct RowStatistics {
  float mean, rstd;
};

// The mean and 1 / std of a row, by one warp (every lane gets them).
template <typename T, int W>
__device__ __forceinline__ RowStatistics row_statistics(const T* x, int64_t C, float eps, int lane) {
  float sum = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> values = Pack<T, W>::load(x + c);
#pragma unroll
    for (int w = 0; w < W; ++w) sum += values[w];
  }
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const Pack<T, W> values = Pack<T, W>::load(x + c);
#pragma unroll
    for (int w = 0; w < W; ++w) squares += (values[w] - mean) * (values[w] - mean);
  }
  return {mean, rsqrtf(warp_sum(squares) / static_cast<float>(C) + eps)};
}

// One normalised element, before rounding to the storage type: one fused multiply-add, written out
// so that every kernel rounds the same way.
__device__ __forceinline__ float normalised(float x, RowStatistics s, float weight, float bias) {
  return fmaf((x - s.mean) * s.rstd, weight, bias);
}

template <typename T, int W>
__global__ void layernorm_forward_kernel(T* out, float* mean_out, float* rstd_out, const T* in,
                                         const T* weight, const T* bias, int64_t M, int64_t C, float eps) {
  using P = Pack<T, W>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;  // whole warps leave together
  const T* x = in + row * C;
  const RowStatistics s = row_statistics<T, W>(x, C, eps, lane);
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P values = P::load(x + c), scale = P::load(weight + c), shift = P::load(bias + c);
    P result;
#pragma unroll
    for (int w = 0; w < W; ++w) result.set(w, normalised(values[w], s, scale[w], shift[w]));
    result.store(out + row * C + c);
  }
  if (lane == 0) {
    mean_out[row] = s.mean;
    rstd_out[row] = s.rstd;
  }
}

// The forward whose output only an fp8 product reads (ops.h, LayerNormForward with fp8): instead
// of the output, its E4M3 codes, fp8(round(y) * scale), in the layout and in the transposed one,
// as cast_fp8 (fp8.cu) would write them from the rounded output, and max |round(y)| into amax.
// Block b takes the 32 rows [32 b, 32 b + 32) (M is a multiple of 16): its warps first take a row
// each in turn for the statistics, as the plain kernel (the same bits, where
// the plain kernel's output would not narrow its pack width W: 16-byte aligned as in the arena), then
// the rows go in tiles of 128 columns as in the cast (warp w rows w, w + 8, ..., lane l columns
// 4 l to 4 l + 3), read again from cache, normalised, cast, and the tile's transpose written from
// shared memory (unless codes_t is null). C is a multiple of 16; the rows' pointers are 8-byte
// aligned (a 4-element Pack).
template <typename T, int W>
__global__ void layernorm_forward_fp8_kernel(uint8_t* codes, uint8_t* codes_t, float* mean_out, float* rstd_out,
                                             const T* in, const T* weight, const T* bias, int64_t M, int64_t C,
                                             float eps, const float* scale_pointer, float* amax) {
  constexpr int kWarps = kThreads / 32;
  __shared__ RowStatistics statistics[kFp8TileRows];
  alignas(16) __shared__ Fp8Tile tile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kFp8TileRows;
  for (int r = warp; r < kFp8TileRows && row0 + r < M; r += kWarps) {
    const int64_t row = row0 + r;
    const RowStatistics s = row_statistics<T, W>(in + row * C, C, eps, lane);
    if (lane == 0) {
      statistics[r] = s;
      mean_out[row] = s.mean;
      rstd_out[row] = s.rstd;
    }
  }
  __syncthreads();
  const float scale = *scale_pointer;
  float largest = 0.0f;
  using P = Pack<T, kFp8Vector>;
  for (int64_t col0 = 0; col0 < C; col0 += kFp8TileColumns) {
    const int64_t col = col0 + lane * kFp8Vector;
    for (int r = warp; r < kFp8TileRows; r += kWarps) {
      const int64_t row = row0 + r;
      if (row >= M || col >= C) continue;
      const P values = P::load(in + row * C + col), gain = P::load(weight + col), shift = P::load(bias + col);
      P rounded;
      uint32_t packed = 0;
#pragma unroll
      for (int v = 0; v < kFp8Vector; ++v) {
        rounded.set(v, normalised(values[v], statistics[r], gain[v], shift[v]));
        largest = fmaxf(largest, fabsf(rounded[v]));
        packed |= static_cast<uint32_t>(to_fp8(rounded[v] * scale, true)) << (8 * v);
      }
      *reinterpret_cast<uint32_t*>(codes + row * C + col) = packed;
      *reinterpret_cast<uint32_t*>(&tile[r][lane * kFp8Vector]) = packed;
    }
    if (codes_t) {  // the same for the whole block
      __syncthreads();
      store_fp8_tile_transposed(tile, codes_t, row0, col0, M, C);
      __syncthreads();  // before the next tile overwrites this one
    }
  }
  largest = block_max(largest);
  if (threadIdx.x == 0) max_into(amax, largest);
}

// The backward's pieces that the plain kernel and the one casting its input gradient for an fp8
// product share, so the two store the same din. A row's two means, of g = dout * weight and of
// g * xhat (xhat = (x - mean) * rstd), by one warp (every lane gets them); each lane takes its W
// columns as the plain forward does. Every multiply-add is written out (fmaf), so no kernel
// contracts them its own way.
struct RowGradient {
  float mean, rstd;       // the forward's statistics
  float grad_mean, grad_dot_mean;
};

template <typename T, int W>
__device__ __forceinline__ RowGradient row_gradient(const T* g, const T* x, const T* weight, float mean, float rstd,
                                                    int64_t C, int lane) {
  using P = Pack<T, W>;
  float grad_sum = 0.0f, grad_dot = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P gradients = P::load(g + c), values = P::load(x + c), scale = P::load(weight + c);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      grad_sum = fmaf(gradients[w], scale[w], grad_sum);
      grad_dot = fmaf(gradients[w] * scale[w] * (values[w] - mean), rstd, grad_dot);
    }
  }
  return {mean, rstd, warp_sum(grad_sum) / static_cast<float>(C), warp_sum(grad_dot) / static_cast<float>(C)};
}

// din's value for one element, before rounding: rstd (g w - grad_mean - xhat grad_dot_mean), written
// over din, or added to `previous` (din's stored value).
__device__ __forceinline__ float input_gradient(float gradient, float weight, float xhat, const RowGradient& r,
                                                bool write, float previous) {
  const float centred = fmaf(-xhat, r.grad_dot_mean, fmaf(gradient, weight, -r.grad_mean));
  return write ? r.rstd * centred : fmaf(r.rstd, centred, previous);
}

__device__ __forceinline__ float normalised_input(float x, const RowGradient& r) { return (x - r.mean) * r.rstd; }

// The backward (layernorm_workspace.h): block (s, r) takes run r's rows, one warp per row in turn,
// and slice s of the columns, at most kSliceColumns wide. A warp reads its row whole for the
// row's two sums, then its slice again (from cache) to add the input gradient into din (or write it) and each
// column's dweight and dbias terms into the warp's own accumulators in shared memory; the block
// then adds its warps' accumulators in warp order into the run's row of partial sums. One slice
// covers C up to kSliceColumns (every GPT-2 size): dout and the input leave DRAM once, where the
// input gradient and the column sums as two kernels read them twice. Wider rows take several
// slices, each reading the whole row for its sums (the slices of a run are neighbouring blocks,
// so mostly from L2). A lane's accumulators move in groups of four floats where W allows (one
// 16-byte shared access, a quarter of the instructions of one float at a time) and are laid out
// [W / group][slice / W] by group and pack, so the lanes of a warp touch consecutive groups (no bank
// conflicts) and each lane only what it zeroed.
constexpr int kBackwardWarps = 4;
// At most 64 registers a thread (ptxas took 66 unbounded), so eight blocks fit an SM where shared
// memory allows (32 C bytes a block and 1 KB reserved, within 228 KB: C up to 880): GPT-2 124M at
// micro-batch 64 makes 1024 runs, one wave on an H100's 132 SMs (1056 blocks) instead of 1.1
// waves whose last tenth runs on a nearly idle GPU.
constexpr int kBackwardBlocksPerSm = 8;
constexpr int64_t kSliceColumns = 2048;

__host__ __device__ inline int64_t slice_width(int64_t C) { return C < kSliceColumns ? C : kSliceColumns; }

inline size_t backward_shared_bytes(int64_t C) {
  return static_cast<size_t>(kBackwardWarps) * 2 * static_cast<size_t>(slice_width(C)) * sizeof(float);
}

template <typename T, int W>
__global__ void __launch_bounds__(32 * kBackwardWarps, kBackwardBlocksPerSm)
    layernorm_backward_kernel(T* din, float* partial_dweight, float* partial_dbias, const T* dout, const T* in,
                              const T* weight, const float* means, const float* rstds, int64_t M, int64_t C,
                              int64_t rows_per_run, bool write_din) {
  using P = Pack<T, W>;
  KILN_DYNAMIC_SHARED_MEMORY(shared);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t width = slice_width(C), first = blockIdx.x * width;
  const int64_t columns = C - first < width ? C - first : width, packs = columns / W;
  constexpr int G = W % 4 == 0 ? 4 : 1;  // floats a group
  struct alignas(4 * G) Group {
    float sums[G];
  };
  float* const accumulators = reinterpret_cast<float*>(shared);
  Group* const dweight = reinterpret_cast<Group*>(accumulators + warp * 2 * width);  // [W / G][packs]
  Group* const dbias = dweight + width / G;
  for (int64_t p = lane; p < packs; p += 32)
#pragma unroll
    for (int q = 0; q < W / G; ++q) dweight[q * packs + p] = dbias[q * packs + p] = Group{};

  const int64_t begin = blockIdx.y * rows_per_run;
  const int64_t end = begin + rows_per_run < M ? begin + rows_per_run : M;
  for (int64_t row = begin + warp; row < end; row += kBackwardWarps) {
    const T* x = in + row * C;
    const T* g = dout + row * C;
    const RowGradient r = row_gradient<T, W>(g, x, weight, means[row], rstds[row], C, lane);
    for (int64_t p = lane; p < packs; p += 32) {
      const int64_t c = first + p * W;
      const P gradients = P::load(g + c), values = P::load(x + c), scale = P::load(weight + c);
      P accumulated = write_din ? P{} : P::load(din + row * C + c);  // din's values, unused where written over
#pragma unroll
      for (int q = 0; q < W / G; ++q) {
        Group weight_sums = dweight[q * packs + p], bias_sums = dbias[q * packs + p];
#pragma unroll
        for (int k = 0; k < G; ++k) {
          const int w = q * G + k;
          const float xhat = normalised_input(values[w], r);
          accumulated.set(w, input_gradient(gradients[w], scale[w], xhat, r, write_din, accumulated[w]));
          weight_sums.sums[k] += gradients[w] * xhat;
          bias_sums.sums[k] += gradients[w];
        }
        dweight[q * packs + p] = weight_sums;
        dbias[q * packs + p] = bias_sums;
      }
      accumulated.store(din + row * C + c);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < 2 * columns; i += blockDim.x) {
    const int64_t half = i / columns, j = i % columns;  // half 0: dweight, 1: dbias
    float sum = 0.0f;
    for (int k = 0; k < kBackwardWarps; ++k) sum += accumulators[(k * 2 + half) * width + j];
    const int64_t group = j / G, column = first + (group % packs) * W + group / packs * G + j % G;
    (half == 0 ? partial_dweight : partial_dbias)[blockIdx.y * C + column] = sum;
  }
}

// The backward whose input gradient an fp8 product's backward reads next (ops.h, LayerNormBackward
// with fp8): din stored as the plain kernel stores it (the same pieces, so the same bits for the
// same pack width W), and cast as cast_fp8 (fp8.cu) would cast the stored din, in its tiles: block
// b takes rows [32 b, 32 b + 32) (M is a multiple of 16); its warps first take a row each in turn
// for the row's means (row_gradient), then the rows go in tiles of 128 columns (warp w rows w, w + 8,
// ..., lane l columns 4 l to 4 l + 3), read again from cache: din stored, its codes written by
// rows and staged for the transposed store, and three sums per column, each summed by a warp over
// its rows and then over the warps in order into row b of [3][blocks][C] partial sums: dweight's,
// dbias's and the product's bias gradient's (bit for bit cast_fp8's column_partials of the stored
// din). Rows' pointers are 8-byte aligned (a 4-element Pack), C a multiple of 16.
struct GradientCodes {
  const float* scale;
  float* amax;
  bool e4m3;
  uint8_t* rows;     // [M, C]
  uint8_t* columns;  // [C, M]
};
constexpr int kBackwardSums = 3;  // dweight, dbias, the product's bias gradient

template <typename T, int W>
__global__ void layernorm_backward_fp8_kernel(T* din, float* partials, const T* dout, const T* in, const T* weight,
                                              const float* means, const float* rstds, int64_t M, int64_t C,
                                              bool write_din, GradientCodes codes) {
  constexpr int kWarps = kThreads / 32;
  __shared__ RowGradient gradients_of[kFp8TileRows];
  alignas(16) __shared__ Fp8Tile tile;
  alignas(16) __shared__ float warp_sums[kBackwardSums][kWarps][kFp8TileColumns];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kFp8TileRows, blocks = gridDim.x;
  for (int r = warp; r < kFp8TileRows && row0 + r < M; r += kWarps) {
    const int64_t row = row0 + r;
    const RowGradient gradient = row_gradient<T, W>(dout + row * C, in + row * C, weight, means[row], rstds[row], C,
                                                    lane);
    if (lane == 0) gradients_of[r] = gradient;
  }
  __syncthreads();
  const float scale = *codes.scale;
  float largest = 0.0f;
  using P = Pack<T, kFp8Vector>;
  for (int64_t col0 = 0; col0 < C; col0 += kFp8TileColumns) {
    const int64_t col = col0 + lane * kFp8Vector;
    float sums[kBackwardSums][kFp8Vector] = {};
    for (int r = warp; r < kFp8TileRows; r += kWarps) {
      const int64_t row = row0 + r, at = row * C + col;
      if (row >= M || col >= C) continue;
      const RowGradient& gradient = gradients_of[r];
      const P gradients = P::load(dout + at), values = P::load(in + at), gain = P::load(weight + col);
      P stored = write_din ? P{} : P::load(din + at);  // din's values, unused where written over
      uint32_t packed = 0;
#pragma unroll
      for (int v = 0; v < kFp8Vector; ++v) {
        const float xhat = normalised_input(values[v], gradient);
        stored.set(v, input_gradient(gradients[v], gain[v], xhat, gradient, write_din, stored[v]));
        sums[0][v] += gradients[v] * xhat;
        sums[1][v] += gradients[v];
        sums[2][v] += stored[v];
        largest = fmaxf(largest, fabsf(stored[v]));
        packed |= static_cast<uint32_t>(to_fp8(stored[v] * scale, codes.e4m3)) << (8 * v);
      }
      stored.store(din + at);
      *reinterpret_cast<uint32_t*>(codes.rows + at) = packed;
      *reinterpret_cast<uint32_t*>(&tile[r][lane * kFp8Vector]) = packed;
    }
    static_assert(kFp8Vector == 4);  // one 16-byte store a lane
#pragma unroll
    for (int k = 0; k < kBackwardSums; ++k)
      *reinterpret_cast<float4*>(&warp_sums[k][warp][lane * kFp8Vector]) =
          make_float4(sums[k][0], sums[k][1], sums[k][2], sums[k][3]);
    __syncthreads();  // the tile's codes and its warps' sums are complete
    for (int i = threadIdx.x; i < kBackwardSums * kFp8TileColumns; i += kThreads) {
      const int k = i / kFp8TileColumns, c = i % kFp8TileColumns;
      if (col0 + c >= C) continue;
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += warp_sums[k][w][c];
      partials[(k * blocks + blockIdx.x) * C + col0 + c] = total;
    }
    store_fp8_tile_transposed(tile, codes.columns, row0, col0, M, C);
    __syncthreads();  // before the next tile overwrites this one's codes and sums
  }
  largest = block_max(largest);
  if (threadIdx.x == 0) max_into(codes.amax, largest);
}

}  // namespace

int layernorm_forward(void* out, float* mean, float* rstd, const void* in, const void* weight, const void* bias,
                      int kind, int64_t M, int64_t C, float eps) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {out, in, weight, bias}, [&](auto width) {
      launch(layernorm_forward_kernel<E, decltype(width)::value>, row_blocks(M), kThreads, 0,
             static_cast<E*>(out), mean, rstd, static_cast<const E*>(in),
             static_cast<const E*>(weight), static_cast<const E*>(bias), M, C, eps);
      return launch_status();
    });
  });
}

int layernorm_forward_fp8(uint8_t* codes, uint8_t* codes_t, float* mean, float* rstd, const void* in,
                          const void* weight, const void* bias, int kind, int64_t M, int64_t C, float eps,
                          const float* scale, float* amax) {
  if (M % 16 != 0 || C % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    for (const void* rows : std::initializer_list<const void*>{in, weight, bias})  // 4-element reads
      if (reinterpret_cast<uintptr_t>(rows) % (kFp8Vector * sizeof(E)) != 0)
        return static_cast<int>(cudaErrorMisalignedAddress);
    return with_pack_width<E>(C, {in, weight, bias}, [&](auto width) {
      launch(layernorm_forward_fp8_kernel<E, decltype(width)::value>,
             static_cast<unsigned>(fp8_cast_tile_rows(M)), kThreads, 0, codes, codes_t, mean, rstd,
             static_cast<const E*>(in), static_cast<const E*>(weight), static_cast<const E*>(bias), M, C, eps, scale,
             amax);
      return launch_status();
    });
  });
}

int layernorm_backward(void* din, float* dweight, float* dbias, const void* dout, const void* in, const void* weight,
                       int kind, const float* mean, const float* rstd, int64_t M, int64_t C, bool write_din,
                       bool write_params, void* workspace) {
  if (M == 0) return write_params ? column_sums_finish(dweight, dbias, nullptr, nullptr, 0, C, true) : 0;
  const int64_t runs = layernorm_backward_runs(M);
  auto* partial_dweight = static_cast<float*>(workspace);
  float* partial_dbias = partial_dweight + runs * C;
  const size_t shared_bytes = backward_shared_bytes(C);
  const dim3 grid(static_cast<unsigned>((C + kSliceColumns - 1) / kSliceColumns), static_cast<unsigned>(runs));
  const int status = dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {din, dout, in, weight}, [&](auto width) {
      const auto kernel = layernorm_backward_kernel<E, decltype(width)::value>;
      if (const cudaError_t set = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(shared_bytes)))
        return static_cast<int>(set);
      launch(kernel, grid, 32 * kBackwardWarps, shared_bytes, static_cast<E*>(din), partial_dweight, partial_dbias,
             static_cast<const E*>(dout), static_cast<const E*>(in), static_cast<const E*>(weight), mean, rstd, M, C,
             (M + runs - 1) / runs, write_din);
      return launch_status();
    });
  });
  return status != 0 ? status
                     : column_sums_finish(dweight, dbias, partial_dweight, partial_dbias, runs, C, write_params);
}

int layernorm_backward_fp8(void* din, float* dweight, float* dbias, float* product_dbias, const void* dout,
                           const void* in, const void* weight, int kind, const float* mean, const float* rstd,
                           int64_t M, int64_t C, bool write_din, bool write_params, const float* scale, float* amax,
                           bool e4m3, uint8_t* codes, uint8_t* codes_t, void* workspace) {
  if (M % 16 != 0 || C % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M == 0 && !write_params) return 0;  // nothing to cast, nothing to add
  const int64_t blocks = fp8_cast_tile_rows(M), part = blocks * C;
  auto* partials = static_cast<float*>(workspace);  // [kBackwardSums][blocks][C]
  const int status = M == 0 ? 0 : dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    for (const void* rows : std::initializer_list<const void*>{din, dout, in, weight})  // 4-element accesses
      if (reinterpret_cast<uintptr_t>(rows) % (kFp8Vector * sizeof(E)) != 0)
        return static_cast<int>(cudaErrorMisalignedAddress);
    return with_pack_width<E>(C, {din, dout, in, weight}, [&](auto width) {
      launch(layernorm_backward_fp8_kernel<E, decltype(width)::value>, static_cast<unsigned>(blocks), kThreads, 0,
             static_cast<E*>(din), partials, static_cast<const E*>(dout), static_cast<const E*>(in),
             static_cast<const E*>(weight), mean, rstd, M, C, write_din,
             GradientCodes{scale, amax, e4m3, codes, codes_t});
      return launch_status();
    });
  });
  if (status != 0) return status;
  if (const int sums = column_sums_finish(dweight, dbias, partials, partials + part, blocks, C, write_params))
    return sums;
  return product_dbias ? column_sums_finish(product_dbias, nullptr, partials + 2 * part, nullptr, blocks, C,
                                            write_params)
                       : 0;
}

}  // namespace kiln::cuda
