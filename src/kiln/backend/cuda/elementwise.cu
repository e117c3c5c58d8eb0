// Elementwise utilities: the residual add, fill, dtype conversion, and the pseudo-random fill of the
// benchmarks.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// The elementwise kernels move W elements at a time (Pack, element.cuh); count is a multiple of W.
template <typename T, int W>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t count) {
  GRID_STRIDE(p, count / W) {
    const auto x = Pack<T, W>::load(a + p * W), y = Pack<T, W>::load(b + p * W);
    Pack<T, W> sum;
#pragma unroll
    for (int w = 0; w < W; ++w) sum.set(w, x[w] + y[w]);
    sum.store(out + p * W);
  }
}

template <typename T, int W>
__global__ void fill_kernel(T* out, float value, int64_t count) {
  Pack<T, W> values;
#pragma unroll
  for (int w = 0; w < W; ++w) values.set(w, value);
  GRID_STRIDE(p, count / W) values.store(out + p * W);
}

template <typename Out, typename In, int W>
__global__ void convert_kernel(Out* out, const In* in, int64_t count) {
  GRID_STRIDE(p, count / W) {
    const auto source = Pack<In, W>::load(in + p * W);
    Pack<Out, W> converted;
#pragma unroll
    for (int w = 0; w < W; ++w) converted.set(w, source[w]);
    converted.store(out + p * W);
  }
}

__global__ void fill_random_kernel(void* out, int kind, int64_t count, uint64_t seed) {
  GRID_STRIDE(i, count) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float value = static_cast<float>(z >> 40) * 0x1.0p-23f - 1.0f;
    if (kind == kFp32) static_cast<float*>(out)[i] = value;
    if (kind == kBf16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(value);
    if (kind == kFp16) static_cast<__half*>(out)[i] = __float2half_rn(value);
  }
}

}  // namespace

int residual_forward(void* out, const void* a, const void* b, int kind, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out, a, b}, [&](auto width) {
      launch(residual_kernel<E, decltype(width)::value>, blocks_for(count / decltype(width)::value),
             kThreads, 0, static_cast<E*>(out), static_cast<const E*>(a), static_cast<const E*>(b),
             count);
      return launch_status();
    });
  });
}

int fill(void* out, int kind, float value, int64_t count) {
  return dispatch(kind, [&](auto tag) {
    using E = decltype(tag);
    return with_pack_width<E>(count, {out}, [&](auto width) {
      launch(fill_kernel<E, decltype(width)::value>, blocks_for(count / decltype(width)::value),
             kThreads, 0, static_cast<E*>(out), value, count);
      return launch_status();
    });
  });
}

// Packs of four elements (16 bytes of fp32, 8 of a 16-bit type) when the count and pointers allow.
int convert(void* out, int out_kind, const void* in, int in_kind, int64_t count) {
  return dispatch(out_kind, [&](auto out_tag) {
    using Out = decltype(out_tag);
    return dispatch(in_kind, [&](auto in_tag) {
      using In = decltype(in_tag);
      return with_pack_width<float>(count, {out, in}, [&](auto width) {
        launch(convert_kernel<Out, In, decltype(width)::value>,
               blocks_for(count / decltype(width)::value), kThreads, 0, static_cast<Out*>(out),
               static_cast<const In*>(in), count);
        return launch_status();
      });
    });
  });
}

int fill_random(void* out, int kind, int64_t count, uint64_t seed) {
  launch(fill_random_kernel, blocks_for(count), kThreads, 0, out, kind, count, seed);
  return launch_status();
}

}  // namespace kiln::cuda
