// LayerNorm forward (optionally fused with the residual add before it) and backward, one warp per
// row; parameter gradients through the fixed-order column sums (kernel_common.cuh), whose partial
// sums take the workspace.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// One warp per row, kRowsPerBlock rows per block: the row's statistics need only warp shuffles (no
// block barriers), and a block of 256 threads keeps eight rows in flight where one row per block
// kept one. Every loop strides over the same columns per lane, so each lane reads back only what
// it wrote.
constexpr int kRowsPerBlock = kThreads / 32;

inline unsigned row_blocks(int64_t M) { return static_cast<unsigned>((M + kRowsPerBlock - 1) / kRowsPerBlock); }

// Columns move W at a time (Pack, element.cuh; C is a multiple of W): lane l takes columns
// [W (l + 32 i), W (l + 32 i) + W).
template <typename T, int W>
__global__ void layernorm_forward_kernel(T* out, float* mean_out, float* rstd_out, const T* in,
                                         const T* weight, const T* bias, const T* residual,
                                         T* residual_out, int64_t M, int64_t C, float eps) {
  using P = Pack<T, W>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;  // whole warps leave together
  const T* x = in + row * C;
  if (residual != nullptr) {  // fused residual add: normalise the rounded sum it writes (may alias in)
    for (int64_t c = lane * W; c < C; c += 32 * W) {
      const P a = P::load(x + c), b = P::load(residual + row * C + c);
      P sum;
#pragma unroll
      for (int w = 0; w < W; ++w) sum.set(w, a[w] + b[w]);
      sum.store(residual_out + row * C + c);
    }
    x = residual_out + row * C;
  }
  float sum = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P values = P::load(x + c);
#pragma unroll
    for (int w = 0; w < W; ++w) sum += values[w];
  }
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float squares = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P values = P::load(x + c);
#pragma unroll
    for (int w = 0; w < W; ++w) squares += (values[w] - mean) * (values[w] - mean);
  }
  const float rstd = rsqrtf(warp_sum(squares) / static_cast<float>(C) + eps);
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P values = P::load(x + c), scale = P::load(weight + c), shift = P::load(bias + c);
    P normalised;
#pragma unroll
    for (int w = 0; w < W; ++w) normalised.set(w, (values[w] - mean) * rstd * scale[w] + shift[w]);
    normalised.store(out + row * C + c);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// din += the input gradient, one warp per row as in forward.
template <typename T, int W>
__global__ void layernorm_backward_input_kernel(T* din, const T* dout, const T* in, const T* weight,
                                                const float* means, const float* rstds, int64_t M,
                                                int64_t C) {
  using P = Pack<T, W>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= M) return;
  const float mean = means[row], rstd = rstds[row];
  const T* x = in + row * C;
  const T* g = dout + row * C;
  float grad_sum = 0.0f, grad_dot = 0.0f;
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P gradients = P::load(g + c), values = P::load(x + c), scale = P::load(weight + c);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float gw = gradients[w] * scale[w];
      grad_sum += gw;
      grad_dot += gw * (values[w] - mean) * rstd;
    }
  }
  const float grad_mean = warp_sum(grad_sum) / static_cast<float>(C);
  const float grad_dot_mean = warp_sum(grad_dot) / static_cast<float>(C);
  for (int64_t c = lane * W; c < C; c += 32 * W) {
    const P gradients = P::load(g + c), values = P::load(x + c), scale = P::load(weight + c);
    P accumulated = P::load(din + row * C + c);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float xhat = (values[w] - mean) * rstd;
      const float delta = rstd * (gradients[w] * scale[w] - grad_mean - xhat * grad_dot_mean);
      accumulated.set(w, accumulated[w] + delta);
    }
    accumulated.store(din + row * C + c);
  }
}

template <typename T, int W>
__global__ void layernorm_backward_params_kernel(float* partial_dweight, float* partial_dbias,
                                                 const T* dout, const T* in, const float* means,
                                                 const float* rstds, int64_t M, int64_t C) {
  column_sums_partial<W>(
      partial_dweight, partial_dbias, M, C,
      [=] __device__(int64_t m, int64_t c, float(&dweight)[W], float(&dbias)[W]) {
        const auto g = Pack<T, W>::load(dout + m * C + c), x = Pack<T, W>::load(in + m * C + c);
        const float mean = means[m], rstd = rstds[m];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          dweight[w] += g[w] * (x[w] - mean) * rstd;
          dbias[w] += g[w];
        }
      });
}

}  // namespace

int layernorm_forward(void* out, float* mean, float* rstd, const void* in, const void* weight, const void* bias,
                      const void* residual, void* residual_out, int kind, int64_t M, int64_t C, float eps) {
  if (M == 0) return 0;
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {out, in, weight, bias, residual, residual_out}, [&](auto width) {
      launch(layernorm_forward_kernel<E, decltype(width)::value>, row_blocks(M), kThreads, 0,
             static_cast<E*>(out), mean, rstd, static_cast<const E*>(in),
             static_cast<const E*>(weight), static_cast<const E*>(bias),
             static_cast<const E*>(residual), static_cast<E*>(residual_out), M, C, eps);
      return launch_status();
    });
  });
}

int layernorm_backward(void* din, float* dweight, float* dbias, const void* dout, const void* in, const void* weight,
                       int kind, const float* mean, const float* rstd, int64_t M, int64_t C, void* workspace) {
  if (M == 0) return 0;
  auto* partial_dweight = static_cast<float*>(workspace);
  float* partial_dbias = partial_dweight + column_sum_chunks(M) * C;
  const int status = dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    const E* grad = static_cast<const E*>(dout);
    const E* x = static_cast<const E*>(in);
    return with_pack_width<E>(C, {din, dout, in, weight}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(layernorm_backward_input_kernel<E, W>, row_blocks(M), kThreads, 0,
             static_cast<E*>(din), grad, x, static_cast<const E*>(weight), mean, rstd, M, C);
      launch(layernorm_backward_params_kernel<E, W>, column_sums_grid(M, C, W),
             dim3(32, kRowGroups), 0, partial_dweight, partial_dbias, grad, x, mean, rstd, M, C);
      return launch_status();
    });
  });
  return status != 0 ? status : column_sums_finish(dweight, dbias, partial_dweight, partial_dbias, M, C);
}

}  // namespace kiln::cuda
