// The bias helpers of the matrix products (lt_matmul.h, cuda_backend.cpp): broadcast a bias (and
// a residual) into the output before an accumulating product and sum a bias gradient's columns,
// where cuBLASLt's epilogues do not take them, and add an epilogue's bias gradient into the
// accumulated one; also the second pass of the fixed-order column sums (kernel_common.cuh).
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* row, const T* addend, int64_t N, int64_t count) {
  GRID_STRIDE(i, count) out[i] = addend ? from_float<T>(to_float(row[i % N]) + to_float(addend[i])) : row[i % N];
}

template <typename T, int W>
__global__ void column_sums_partial_kernel(float* partials, const T* in, int64_t M, int64_t N) {
  column_sums_partial<W>(partials, nullptr, M, N,
                         [=] __device__(int64_t m, int64_t n, float(&a)[W], float(&)[W]) {
                           const auto values = Pack<T, W>::load(in + m * N + n);
#pragma unroll
                           for (int w = 0; w < W; ++w) a[w] += values[w];
                         });
}

// sums_a (blockIdx.y 0) or sums_b (1) += (or =) the chunks' partial rows, in a fixed order: block x takes
// 32 columns, warp k adds chunks k, k + kFinishWarps, ... and the warps' sums are then added in warp
// order. Spreading the chunks over warps keeps a column's loads in flight together; one thread per
// column looping over the chunks (the first version) waited on each load in turn, which at the fp8
// bias gradient's 2048 tile rows (M = 65,536) was about a hundred microseconds a call. A thread
// also loads kFinishInFlight of its chunks before adding them (in the same order): at 2048 chunks
// its 128 loads wait on memory 8 times, not 32 (nvcc's unrolling by 4). The fp8 LayerNorm backward
// ends in two of these calls, and the bias gradients of the fp8 products' casts in one each.
constexpr int kFinishWarps = 16, kFinishInFlight = 16;

__global__ void column_sums_finish_kernel(float* sums_a, float* sums_b, const float* partial_a,
                                          const float* partial_b, int64_t chunks, int64_t N, bool overwrite) {
  __shared__ float warp_sums[kFinishWarps][32];
  const int64_t column = blockIdx.x * 32 + threadIdx.x;
  const float* partials = blockIdx.y == 0 ? partial_a : partial_b;
  float sum = 0.0f;
  if (column < N)  // chunks threadIdx.y, threadIdx.y + kFinishWarps, ...
    for_each_pack<kFinishInFlight, 1>(partials + column, threadIdx.y * N, kFinishWarps * N, chunks * N,
                                      [&](const Pack<float, 1>& value, int64_t) { sum += value[0]; });
  warp_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < N) {
    for (int k = 1; k < kFinishWarps; ++k) sum += warp_sums[k][threadIdx.x];
    float& result = (blockIdx.y == 0 ? sums_a : sums_b)[column];
    result = overwrite ? sum : result + sum;
  }
}

__global__ void add_floats_kernel(float* sums, const float* values, int64_t count) {
  GRID_STRIDE(i, count) sums[i] += values[i];
}

}  // namespace

int broadcast_rows(void* out, const void* row, const void* addend, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(broadcast_rows_kernel<E>, blocks_for(M * N), kThreads, 0, static_cast<E*>(out),
           static_cast<const E*>(row), static_cast<const E*>(addend), N, M * N);
    return launch_status();
  });
}

size_t column_sums_workspace_bytes(int64_t M, int64_t N) {
  return 2 * static_cast<size_t>(column_sum_chunks(M) * N) * sizeof(float);
}

int column_sums_finish(float* sums_a, float* sums_b, const float* partial_a, const float* partial_b, int64_t chunks,
                       int64_t N, bool overwrite) {
  const dim3 grid(static_cast<unsigned>((N + 31) / 32), sums_b ? 2 : 1);
  launch(column_sums_finish_kernel, grid, dim3(32, kFinishWarps), 0, sums_a, sums_b, partial_a, partial_b, chunks, N,
         overwrite);
  return launch_status();
}

int sum_columns(float* sums, const void* in, int kind, int64_t M, int64_t N, void* workspace, bool overwrite) {
  if (M == 0) return overwrite ? column_sums_finish(sums, nullptr, nullptr, nullptr, 0, N, true) : 0;
  auto* partials = static_cast<float*>(workspace);
  const int status = dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(N, {in}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(column_sums_partial_kernel<E, W>, column_sums_grid(M, N, W), dim3(32, kRowGroups), 0,
             partials, static_cast<const E*>(in), M, N);
      return launch_status();
    });
  });
  return status != 0 ? status
                     : column_sums_finish(sums, nullptr, partials, nullptr, column_sum_chunks(M), N, overwrite);
}

int sum_column_partials(float* sums, const float* partials, int64_t chunks, int64_t N, bool overwrite) {
  return column_sums_finish(sums, nullptr, partials, nullptr, chunks, N, overwrite);
}

int add_floats(float* sums, const float* values, int64_t count) {
  launch(add_floats_kernel, blocks_for(count), kThreads, 0, sums, values, count);
  return launch_status();
}

}  // namespace kiln::cuda
