// The bias helpers of the matrix products (lt_matmul.h, cuda_backend.cpp): broadcast a bias into
// the output before an accumulating product and sum a bias gradient's columns, where cuBLASLt's
// epilogues do not take them, and add an epilogue's bias gradient into the accumulated one; also
// the second pass of the fixed-order column sums (kernel_common.cuh).
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* row, int64_t N, int64_t count) {
  GRID_STRIDE(i, count) out[i] = row[i % N];
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

__global__ void column_sums_finish_kernel(float* sums_a, float* sums_b, const float* partial_a,
                                          const float* partial_b, int64_t N, int64_t chunks) {
  GRID_STRIDE(n, N) {
    float a = 0.0f, b = 0.0f;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      a += partial_a[chunk * N + n];
      if (sums_b) b += partial_b[chunk * N + n];
    }
    sums_a[n] += a;
    if (sums_b) sums_b[n] += b;
  }
}

__global__ void add_floats_kernel(float* sums, const float* values, int64_t count) {
  GRID_STRIDE(i, count) sums[i] += values[i];
}

}  // namespace

int broadcast_rows(void* out, const void* row, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    launch(broadcast_rows_kernel<E>, blocks_for(M * N), kThreads, 0, static_cast<E*>(out),
           static_cast<const E*>(row), N, M * N);
    return launch_status();
  });
}

size_t column_sums_workspace_bytes(int64_t M, int64_t N) {
  return 2 * static_cast<size_t>(column_sum_chunks(M) * N) * sizeof(float);
}

int column_sums_finish(float* sums_a, float* sums_b, const float* partial_a, const float* partial_b, int64_t M,
                       int64_t N) {
  launch(column_sums_finish_kernel, blocks_for(N), kThreads, 0, sums_a, sums_b, partial_a,
         partial_b, N, column_sum_chunks(M));
  return launch_status();
}

int column_sums_add(float* sums, const void* in, int kind, int64_t M, int64_t N, void* workspace) {
  if (M == 0) return 0;
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
  return status != 0 ? status : column_sums_finish(sums, nullptr, partials, nullptr, M, N);
}

int add_column_partials(float* sums, const float* partials, int64_t chunks, int64_t N) {
  launch(column_sums_finish_kernel, blocks_for(N), kThreads, 0, sums, nullptr, partials, nullptr, N, chunks);
  return launch_status();
}

int add_floats(float* sums, const float* values, int64_t count) {
  launch(add_floats_kernel, blocks_for(count), kThreads, 0, sums, values, count);
  return launch_status();
}

}  // namespace kiln::cuda
