// Elementwise utilities: fill, dtype conversion, and the pseudo-random fill of the
// benchmarks.
#include "kiln/backend/cuda/kernel_common.cuh"

namespace kiln::cuda {
namespace {

// The elementwise kernels move W elements at a time (Pack, element.cuh); count is a multiple of W.
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

// 24 pseudo-random bits for element i (splitmix64 of seed and index).
__device__ __forceinline__ uint32_t random_bits(uint64_t seed, int64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 40);
}

__global__ void fill_random_kernel(void* out, int kind, int64_t count, uint64_t seed) {
  GRID_STRIDE(i, count) {
    const float value = static_cast<float>(random_bits(seed, i)) * 0x1.0p-23f - 1.0f;
    if (kind == kFp32) static_cast<float*>(out)[i] = value;
    if (kind == kBf16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(value);
    if (kind == kFp16) static_cast<__half*>(out)[i] = __float2half_rn(value);
  }
}

// fp8 E4M3 codes (core/dtype.h) of magnitude below 1: a random sign, exponent field 0-6 and
// mantissa, so never NaN.
__global__ void fill_random_fp8_e4m3_kernel(uint8_t* out, int64_t count, uint64_t seed) {
  GRID_STRIDE(i, count) {
    const uint32_t bits = random_bits(seed, i);
    out[i] = static_cast<uint8_t>((bits & 0x80u) | (((bits >> 8) % 7u) << 3) | (bits & 0x7u));
  }
}

}  // namespace

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

int fill_random_fp8_e4m3(uint8_t* out, int64_t count, uint64_t seed) {
  launch(fill_random_fp8_e4m3_kernel, blocks_for(count), kThreads, 0, out, count, seed);
  return launch_status();
}

}  // namespace kiln::cuda
