// MaskRows (ops.h): [M, C] rows kept as stored or zeroed, by a row's keep value; the op is its own
// backward. Packs of W elements (element.cuh), W dividing C, so a pack never straddles two rows;
// each thread reads only its own pack, so out may alias in.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

template <typename E, int W>
__global__ void mask_rows_kernel(E* out, const E* in, const int32_t* keep, int64_t M, int64_t C) {
  GRID_STRIDE(p, M * C / W) {
    Pack<E, W> values;
    if (keep[p * W / C] != 0) {
      values = Pack<E, W>::load(in + p * W);
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) values.set(w, 0.0f);
    }
    values.store(out + p * W);
  }
}

}  // namespace

int mask_rows(void* out, const void* in, const int32_t* keep, int kind, int64_t M, int64_t C) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(C, {out, in}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      launch(mask_rows_kernel<E, W>, blocks_for(M * C / W), kThreads, 0, static_cast<E*>(out),
             static_cast<const E*>(in), keep, M, C);
      return launch_status();
    });
  });
}

}  // namespace kiln::cuda
