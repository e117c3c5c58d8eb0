// GatherRows (ops.h): one position of each sequence, [B, T, C] -> [B, C], and its backward. The
// forward copies packs as stored (no arithmetic); the backward's Write covers all of din in one
// kernel, the position's rows from dout and zeros elsewhere, so no fill pass goes before it, and
// its Add touches only the position's rows. W elements a pack (element.cuh), W dividing C, so a
// pack never straddles two rows.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename E, int W>
__global__ void gather_rows_kernel(E* out, const E* in, int64_t B, int64_t T, int64_t C, int64_t position) {
  GRID_STRIDE(p, B * C / W) {
    const int64_t b = p * W / C, c = p * W % C;
    Pack<E, W>::load(in + (b * T + position) * C + c).store(out + p * W);
  }
}

// Write: every pack of din, from dout at the position and zero elsewhere.
template <typename E, int W>
__global__ void scatter_rows_write_kernel(E* din, const E* dout, int64_t B, int64_t T, int64_t C,
                                          int64_t position) {
  GRID_STRIDE(p, B * T * C / W) {
    const int64_t row = p * W / C, c = p * W % C, b = row / T;
    Pack<E, W> d;
    if (row % T == position) {
      d = Pack<E, W>::load(dout + b * C + c);
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) d.set(w, 0.0f);
    }
    d.store(din + p * W);
  }
}

// Add: the position's rows of din += dout, in fp32 and rounded once.
template <typename E, int W>
__global__ void scatter_rows_add_kernel(E* din, const E* dout, int64_t B, int64_t T, int64_t C, int64_t position) {
  GRID_STRIDE(p, B * C / W) {
    const int64_t b = p * W / C, c = p * W % C;
    E* at = din + (b * T + position) * C + c;
    const auto g = Pack<E, W>::load(dout + p * W);
    auto d = Pack<E, W>::load(at);
#pragma unroll
    for (int w = 0; w < W; ++w) d.set(w, d[w] + g[w]);
    d.store(at);
  }
}

}  // namespace

int gather_rows(void* out, const void* in, int kind, int64_t B, int64_t T, int64_t C, int64_t position) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {out, in}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(gather_rows_kernel<E, W>, blocks_for(B * C / W), kThreads, 0, static_cast<E*>(out),
             static_cast<const E*>(in), B, T, C, position);
      return launch_status();
    });
  });
}

int gather_rows_backward(void* din, const void* dout, int kind, int64_t B, int64_t T, int64_t C, int64_t position,
                         bool write) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {din, dout}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      if (write)
        launch(scatter_rows_write_kernel<E, W>, blocks_for(B * T * C / W), kThreads, 0, static_cast<E*>(din),
               static_cast<const E*>(dout), B, T, C, position);
      else
        launch(scatter_rows_add_kernel<E, W>, blocks_for(B * C / W), kThreads, 0, static_cast<E*>(din),
               static_cast<const E*>(dout), B, T, C, position);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
