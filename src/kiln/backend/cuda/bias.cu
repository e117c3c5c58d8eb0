// The bias helpers of the matrix products when cuBLASLt's epilogues do not take them
// (matmul.cpp): broadcast a bias into the output before an accumulating product, and add a bias
// gradient's column sums in a fixed order.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* row, int64_t N, int64_t count) {
  GRID_STRIDE(i, count) out[i] = row[i % N];
}

template <typename T>
__global__ void column_sums_add_kernel(float* sums, const T* in, int64_t M, int64_t N) {
  column_sums(sums, nullptr, M, N,
              [=] __device__(int64_t m, int64_t n) { return make_float2(to_float(in[m * N + n]), 0.0f); });
}

}  // namespace

int broadcast_rows(void* out, const void* row, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    broadcast_rows_kernel<<<blocks_for(M * N), kThreads>>>(static_cast<E*>(out), static_cast<const E*>(row), N, M * N);
    return launch_status();
  });
}

int column_sums_add(float* sums, const void* in, int kind, int64_t M, int64_t N) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    column_sums_add_kernel<<<static_cast<unsigned>((N + 31) / 32), dim3(32, kRowGroups)>>>(
        sums, static_cast<const E*>(in), M, N);
    return launch_status();
  });
}

}  // namespace kiln::cuda
