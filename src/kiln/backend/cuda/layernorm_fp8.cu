// The LayerNorms that cast for an fp8 product (ops.h, LayerNormForward and LayerNormBackward with
// fp8). The forward writes, instead of its output, the output's E4M3 codes in the layout and the
// transposed one, as cast_fp8 (fp8.cu) would from layernorm_forward's stored output, and folds
// max |output| into amax. The backward stores din as layernorm_backward does (the same bits for
// the same pack width W), its codes in both layouts as cast_fp8 would from the stored din, and
// the product's bias gradient with its own two. Block b takes the 32 rows [32 b, 32 b + 32) of a
// cast's tile (M a multiple of 16, C of 16), in one of two forms:
// - rows in registers, where a row fits kMaxRowPacks packs of W = kPackWidth a lane (C up to 1280
//   in 16-bit types: every GPT-2 size) and the pointers are 16-byte aligned: warp w loads rows w,
//   w + 8, w + 16, w + 24 once each, one at a time (asking L2 for the next while it works on one),
//   takes the row's sums from the registers (layernorm_rows.cuh) and writes its outputs from them,
//   staging the codes of all 32 rows in shared memory for the transposed store at the end. dout
//   and the input leave DRAM once.
// - rows in tiles (any C): the warps first take a row each in turn for its sums, then the rows go
//   in tiles of 128 columns as in the cast (warp w rows w, w + 8, ..., lane l columns 4 l to
//   4 l + 3), read again. With 32 rows of dout and the input a block, the blocks resident on an
//   H100 (eight an SM) hold about twice its L2 between the two reads, so the second is likely to
//   come from DRAM again: the register form's reason.
#include "kiln/backend/cuda/fp8_tile.cuh"
#include "kiln/backend/cuda/layernorm_rows.cuh"
#include "kiln/backend/layernorm_workspace.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kMaxRowPacks = 5;

// The shared memory of a block of the register form: its 32 rows of codes, rows C + 4 bytes apart
// (store_fp8_columns_transposed's bank rule); the backward's then also the warps' column sums,
// [kBackwardSums][kWarps][C] floats (16-byte aligned after the codes: C is a multiple of 16).
constexpr int kBackwardSums = 3;  // dweight, dbias, the product's bias gradient
__host__ __device__ inline int staged_pitch(int64_t C) { return static_cast<int>(C) + 4; }
__host__ __device__ inline size_t staged_codes_bytes(int64_t C) {
  return static_cast<size_t>(kFp8TileRows) * staged_pitch(C);
}
inline size_t staged_sums_bytes(int64_t C) { return static_cast<size_t>(kBackwardSums * kWarps * C) * sizeof(float); }

// Calls launch(std::integral_constant<int, P>{}) with the fewest packs of W a lane, P, that hold a
// row of C; C is at most 32 W kMaxRowPacks.
template <int W, int P = 1, typename Launch>
int with_row_packs(int64_t C, Launch launch) {
  if constexpr (P > kMaxRowPacks) {
    return static_cast<int>(cudaErrorInvalidValue);
  } else {
    if (C <= 32 * W * P) return launch(std::integral_constant<int, P>{});
    return with_row_packs<W, P + 1>(C, launch);
  }
}

// Whether rows of C elements at these pointers, moved in packs of W, take the register form.
template <int W>
bool rows_fit_registers(int64_t C, std::initializer_list<const void*> pointers) {
  return C <= 32 * W * kMaxRowPacks && aligned_to(16, pointers);
}

// ---- The forward --------------------------------------------------------------------------------

// The register form: each output element rounded to T, as the plain forward stores it, then cast.
template <typename T, int W, int P>
__global__ void layernorm_forward_fp8_rows_kernel(uint8_t* codes, uint8_t* codes_t, float* mean_out, float* rstd_out,
                                                  const T* in, const T* weight, const T* bias, int64_t M, int64_t C,
                                                  float eps, const float* scale_pointer, float* amax) {
  KILN_DYNAMIC_SHARED_MEMORY(staged);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pitch = staged_pitch(C);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kFp8TileRows;
  const float scale = *scale_pointer;
  float largest = 0.0f;
  for (int r = warp; r < kFp8TileRows && row0 + r < M; r += kWarps) {
    const int64_t row = row0 + r;
    if (r + kWarps < kFp8TileRows && row + kWarps < M)  // the warp's next row
      prefetch_row_to_l2(in + (row + kWarps) * C, C * static_cast<int64_t>(sizeof(T)), lane);
    RowPacks<T, W, P> x;
    x.load(in + row * C, C, lane);
    const RowStatistics s = row_statistics(x, C, eps, lane);
    if (lane == 0) {
      mean_out[row] = s.mean;
      rstd_out[row] = s.rstd;
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t c = row_column<W>(lane, p);
      if (c >= C) continue;
      const Pack<T, W> gain = Pack<T, W>::load(weight + c), shift = Pack<T, W>::load(bias + c);
      CodePack<W> packed;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float rounded = to_float(from_float<T>(normalised(x.packs[p][w], s, gain[w], shift[w])));
        largest = fmaxf(largest, fabsf(rounded));
        packed.code[w] = to_fp8(rounded * scale, true);
      }
      packed.store(codes + row * C + c);
      packed.stage(staged + r * pitch + c);
    }
  }
  if (codes_t) {  // the same for the whole block
    __syncthreads();
    store_fp8_columns_transposed(staged, pitch, static_cast<int>(C), codes_t, row0, 0, M, C);
  }
  largest = block_max(largest);
  if (threadIdx.x == 0) max_into(amax, largest);
}

// The tile form: the statistics as the plain kernel takes them (the same bits for the same W), the
// outputs 4 elements a lane; the rows' pointers are 8-byte aligned (a 4-element Pack).
template <typename T, int W>
__global__ void layernorm_forward_fp8_tiles_kernel(uint8_t* codes, uint8_t* codes_t, float* mean_out,
                                                   float* rstd_out, const T* in, const T* weight, const T* bias,
                                                   int64_t M, int64_t C, float eps, const float* scale_pointer,
                                                   float* amax) {
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

// ---- The backward -------------------------------------------------------------------------------

// Both forms store din and its codes, and sum three terms per column, each by a warp over its rows
// in order and then over the warps in order into row b of [3][blocks][C] partial sums: dweight's,
// dbias's and the product's bias gradient's (bit for bit cast_fp8's column_partials of the stored
// din).
struct GradientCodes {
  const float* scale;
  float* amax;
  bool e4m3;
  uint8_t* rows;     // [M, C]
  uint8_t* columns;  // [C, M]
};
// The register form: a warp holds its row of dout, of the input and of din's previous values (see
// kPreviousWithRow). A lane keeps its columns' three sums, 3 W P floats: ptxas (nvcc 13.0, sm_90a)
// gives 186 registers a thread at C = 768 in bf16, 236 at 1024 and 249 at 1280, so one block an
// SM (bounded to two, 128 registers, it spilled 300 bytes at 768). So its shared memory costs no
// residency: the sums are staged at once beside the codes (98 KB at C = 768, 164 KB at 1280), and
// the block's last phase is one barrier, not one a sum.
template <typename T, int W, int P>
__global__ void __launch_bounds__(kThreads, 1)
    layernorm_backward_fp8_rows_kernel(T* din, float* partials, const T* dout, const T* in, const T* weight,
                                       const float* means, const float* rstds, int64_t M, int64_t C, bool write_din,
                                       GradientCodes codes) {
  // din's previous values are read with the row where registers allow, so that a row waits on
  // memory once; at 5 packs (1280 columns in bf16) holding them spilled, so there they are read
  // where they are added to.
  constexpr bool kPreviousWithRow = P <= 4;
  KILN_DYNAMIC_SHARED_MEMORY(staged);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pitch = staged_pitch(C);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kFp8TileRows, blocks = gridDim.x;
  const float scale = *codes.scale;
  float largest = 0.0f, sums[kBackwardSums][P][W] = {};
  for (int r = warp; r < kFp8TileRows && row0 + r < M; r += kWarps) {
    const int64_t row = row0 + r;
    if (r + kWarps < kFp8TileRows && row + kWarps < M) {  // the warp's next row
      const int64_t next = (row + kWarps) * C, bytes = C * static_cast<int64_t>(sizeof(T));
      prefetch_row_to_l2(dout + next, bytes, lane);
      prefetch_row_to_l2(in + next, bytes, lane);
      if (!write_din) prefetch_row_to_l2(din + next, bytes, lane);
    }
    RowPacks<T, W, P> g, x, previous{};  // previous: din's values, unused where written over
    g.load(dout + row * C, C, lane);
    x.load(in + row * C, C, lane);
    if (kPreviousWithRow && !write_din) previous.load(din + row * C, C, lane);
    const RowGradient gradient = row_gradient(g, x, weight, means[row], rstds[row], C, lane);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t c = row_column<W>(lane, p), at = row * C + c;
      if (c >= C) continue;
      const Pack<T, W> gain = Pack<T, W>::load(weight + c);
      if (!kPreviousWithRow && !write_din) previous.packs[p] = Pack<T, W>::load(din + at);
      Pack<T, W> stored;
      CodePack<W> packed;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float xhat = normalised_input(x.packs[p][w], gradient);
        stored.set(w, input_gradient(g.packs[p][w], gain[w], xhat, gradient, write_din, previous.packs[p][w]));
        sums[0][p][w] += g.packs[p][w] * xhat;
        sums[1][p][w] += g.packs[p][w];
        sums[2][p][w] += stored[w];
        largest = fmaxf(largest, fabsf(stored[w]));
        packed.code[w] = to_fp8(stored[w] * scale, codes.e4m3);
      }
      stored.store(din + at);
      packed.store(codes.rows + at);
      packed.stage(staged + r * pitch + c);
    }
  }
  // Each warp's sums staged beside the codes, then every column's added over the warps in order.
  float* const warp_sums = reinterpret_cast<float*>(staged + staged_codes_bytes(C));  // [k][warp][C]
#pragma unroll
  for (int k = 0; k < kBackwardSums; ++k)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t c = row_column<W>(lane, p);
      if (c >= C) continue;
#pragma unroll
      for (int w = 0; w < W; w += 4)
        *reinterpret_cast<float4*>(warp_sums + (k * kWarps + warp) * C + c + w) =
            make_float4(sums[k][p][w], sums[k][p][w + 1], sums[k][p][w + 2], sums[k][p][w + 3]);
    }
  __syncthreads();  // the codes and the sums are staged
  store_fp8_columns_transposed(staged, pitch, static_cast<int>(C), codes.columns, row0, 0, M, C);
  for (int64_t i = threadIdx.x; i < kBackwardSums * C; i += kThreads) {
    const int64_t k = i / C, c = i % C;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[(k * kWarps + w) * C + c];
    partials[(k * blocks + blockIdx.x) * C + c] = total;
  }
  largest = block_max(largest);
  if (threadIdx.x == 0) max_into(codes.amax, largest);
}

// The tile form: the row's means as the plain kernel takes them (row_gradient, the same bits for
// the same W); rows' pointers 8-byte aligned (a 4-element Pack).
template <typename T, int W>
__global__ void layernorm_backward_fp8_tiles_kernel(T* din, float* partials, const T* dout, const T* in,
                                                    const T* weight, const float* means, const float* rstds, int64_t M,
                                                    int64_t C, bool write_din, GradientCodes codes) {
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

// The 4-element accesses of the tile forms need every row's pointer aligned to 4 elements.
template <typename E>
int tile_alignment_status(std::initializer_list<const void*> pointers) {
  for (const void* rows : pointers)
    if (reinterpret_cast<uintptr_t>(rows) % (kFp8Vector * sizeof(E)) != 0)
      return static_cast<int>(cudaErrorMisalignedAddress);
  return 0;
}

}  // namespace

int layernorm_forward_fp8(uint8_t* codes, uint8_t* codes_t, float* mean, float* rstd, const void* in,
                          const void* weight, const void* bias, int kind, int64_t M, int64_t C, float eps,
                          const float* scale, float* amax) {
  if (M % 16 != 0 || C % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(fp8_cast_tile_rows(M));
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    if (const int misaligned = tile_alignment_status<E>({in, weight, bias})) return misaligned;
    return with_pack_width<E>(C, {in, weight, bias}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      if constexpr (W == kPackWidth<E>)
        if (rows_fit_registers<W>(C, {codes, codes_t, in, weight, bias}))
          return with_row_packs<W>(C, [&](auto packs) {
            launch(layernorm_forward_fp8_rows_kernel<E, W, decltype(packs)::value>, blocks, kThreads,
                   staged_codes_bytes(C), codes, codes_t, mean, rstd, static_cast<const E*>(in),
                   static_cast<const E*>(weight), static_cast<const E*>(bias), M, C, eps, scale, amax);
            return launch_status();
          });
      launch(layernorm_forward_fp8_tiles_kernel<E, W>, blocks, kThreads, 0, codes, codes_t, mean, rstd,
             static_cast<const E*>(in), static_cast<const E*>(weight), static_cast<const E*>(bias), M, C, eps, scale,
             amax);
      return launch_status();
    });
  });
}

int layernorm_backward_fp8(void* din, float* dweight, float* dbias, float* product_dbias, const void* dout,
                           const void* in, const void* weight, int kind, const float* mean, const float* rstd,
                           int64_t M, int64_t C, bool write_din, bool write_params, const float* scale, float* amax,
                           bool e4m3, uint8_t* codes, uint8_t* codes_t, void* workspace) {
  if (M % 16 != 0 || C % 16 != 0) return static_cast<int>(cudaErrorInvalidValue);
  if (M == 0 && !write_params) return 0;  // nothing to cast, nothing to add
  const int64_t blocks = fp8_cast_tile_rows(M), part = blocks * C;
  auto* partials = static_cast<float*>(workspace);  // [kBackwardSums][blocks][C]
  const GradientCodes gradient_codes{scale, amax, e4m3, codes, codes_t};
  const int status = M == 0 ? 0 : dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    if (const int misaligned = tile_alignment_status<E>({din, dout, in, weight})) return misaligned;
    return with_pack_width<E>(C, {din, dout, in, weight}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      if constexpr (W == kPackWidth<E>) {
        if (rows_fit_registers<W>(C, {codes, codes_t, din, dout, in, weight})) {
          bool launched = false;
          const int rows_status = with_row_packs<W>(C, [&](auto packs) {
            const auto kernel = layernorm_backward_fp8_rows_kernel<E, W, decltype(packs)::value>;
            const size_t shared_bytes = staged_codes_bytes(C) + staged_sums_bytes(C);  // 164 KB at C = 1280
            if (!allow_shared_memory(kernel, shared_bytes)) return 0;  // the tile form, below
            launch(kernel, static_cast<unsigned>(blocks), kThreads, shared_bytes, static_cast<E*>(din), partials,
                   static_cast<const E*>(dout), static_cast<const E*>(in), static_cast<const E*>(weight), mean, rstd,
                   M, C, write_din, gradient_codes);
            launched = true;
            return launch_status();
          });
          if (launched || rows_status != 0) return rows_status;
        }
      }
      launch(layernorm_backward_fp8_tiles_kernel<E, W>, static_cast<unsigned>(blocks), kThreads, 0,
             static_cast<E*>(din), partials, static_cast<const E*>(dout), static_cast<const E*>(in),
             static_cast<const E*>(weight), mean, rstd, M, C, write_din, gradient_codes);
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
