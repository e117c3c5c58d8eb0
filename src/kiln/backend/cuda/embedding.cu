// Token + position embedding (kernels.h, ops.h). Backward is deterministic without atomics: token
// rows are reduced after a stable radix sort of the positions by token.
#include <cub/device/device_radix_sort.cuh>

#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t T_,
                                         int64_t C, int64_t count) {
  GRID_STRIDE(i, count) {
    const int64_t position = i / C, c = i % C;
    out[i] = from_float<T>(to_float(wte[tokens[position] * C + c]) + to_float(wpe[(position % T_) * C + c]));
  }
}

// dwte without atomics: positions arrive sorted by token (stable, so in position order within a
// token); the block that starts a run of equal tokens adds the run's rows in order. The run's end
// comes from a binary search and its positions are staged in shared memory, so a thread's loads
// of dout rows do not wait on one another: a common token's run is thousands of rows in real text.
constexpr int kColumnsPerThread = 4;

template <typename T>
__global__ void embedding_backward_tokens_kernel(float* dwte, const T* dout, const int32_t* sorted_tokens,
                                                 const int32_t* sorted_positions, int64_t positions, int64_t C) {
  const int64_t start = blockIdx.x;
  if (start >= positions || (start > 0 && sorted_tokens[start] == sorted_tokens[start - 1])) return;
  const int32_t token = sorted_tokens[start];
  int64_t low = start + 1, high = positions;  // the run ends at the first other token
  while (low < high) {
    const int64_t middle = (low + high) / 2;
    if (sorted_tokens[middle] == token) low = middle + 1;
    else high = middle;
  }
  const int64_t end = low;
  __shared__ int32_t rows[kThreads];
  for (int64_t c0 = 0; c0 < C; c0 += static_cast<int64_t>(blockDim.x) * kColumnsPerThread) {
    float sums[kColumnsPerThread] = {};
    for (int64_t i0 = start; i0 < end; i0 += kThreads) {
      const int count = end - i0 < kThreads ? static_cast<int>(end - i0) : kThreads;
      __syncthreads();  // the previous chunk's rows are read by every thread
      if (static_cast<int>(threadIdx.x) < count)
        rows[threadIdx.x] = sorted_positions[i0 + threadIdx.x];
      __syncthreads();
      for (int r = 0; r < count; ++r) {
        const T* row = dout + static_cast<int64_t>(rows[r]) * C;
#pragma unroll
        for (int j = 0; j < kColumnsPerThread; ++j) {
          const int64_t c = c0 + threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
          if (c < C) sums[j] += to_float(row[c]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int64_t c = c0 + threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (c < C) dwte[token * C + c] += sums[j];
    }
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
    launch(embedding_forward_kernel<E>, blocks_for(B * T * C), kThreads, 0, static_cast<E*>(out),
           tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe), T, C, B * T * C);
    return launch_status();
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
  if (const cudaError_t status = cub::DeviceRadixSort::SortPairs(
          sort_storage, sort_bytes, tokens, sorted_tokens, positions_in, sorted_positions,
          static_cast<int>(positions), 0, static_cast<int>(sizeof(int32_t) * 8), compute_stream()))
    return static_cast<int>(status);
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    const E* grad = static_cast<const E*>(dout);
    launch(embedding_backward_tokens_kernel<E>, static_cast<unsigned>(positions), kThreads, 0, dwte,
           grad, sorted_tokens, sorted_positions, positions, C);
    launch(embedding_backward_positions_kernel<E>, blocks_for((write_dwpe ? dwpe_rows : T) * C), kThreads, 0, dwpe,
           grad, B, T, C, dwpe_rows, write_dwpe);
    return launch_status();
  });
}

}  // namespace kiln::cuda
