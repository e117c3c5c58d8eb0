// LayerNorm forward, one warp per row; and backward, one warp per row with the parameter gradients
// summed in the same pass into partial sums a run of rows (layernorm_workspace.h), which take the
// workspace. The forms that cast for an fp8 product are in layernorm_fp8.cu; the per-row pieces
// both use, so that they give the same bits, in layernorm_rows.cuh.
#include "kiln/backend/cuda/layernorm_rows.cuh"
#include "kiln/backend/layernorm_workspace.h"

namespace kiln::cuda {
namespace {

// One warp per row, kRowsPerBlock rows per block: the row's statistics need only warp shuffles (no
// block barriers), and a block of 256 threads keeps eight rows in flight where one row per block
// kept one. Every loop strides over the same columns per lane (layernorm_rows.cuh: W at a time,
// Pack, element.cuh; C is a multiple of W), so each lane reads back only what it wrote.
constexpr int kRowsPerBlock = kThreads / 32;

inline unsigned row_blocks(int64_t M) { return static_cast<unsigned>((M + kRowsPerBlock - 1) / kRowsPerBlock); }

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

}  // namespace kiln::cuda
