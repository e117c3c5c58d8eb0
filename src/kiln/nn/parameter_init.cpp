#include "kiln/nn/parameter_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kiln/core/error.h"
#include "kiln/core/philox.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace {

// Box-Muller on two words' top 24 bits, in float (the draws are fp32 anyway): u1 in (0, 1], so the
// logarithm is finite, and u2 in [0, 1). The largest |z| is sqrt(2 ln 2^24) = 5.8.
void normal_pair(uint32_t w1, uint32_t w2, float& z0, float& z1) {
  const float u1 = static_cast<float>((w1 >> 8) + 1) * 0x1.0p-24f;
  const float u2 = static_cast<float>(w2 >> 8) * 0x1.0p-24f;
  const float radius = std::sqrt(-2.0f * std::log(u1));
  const float angle = 2.0f * std::numbers::pi_v<float> * u2;
  z0 = radius * std::cos(angle);
  z1 = radius * std::sin(angle);
}

// Elements [begin, end) of a tensor's normal stream, times stddev, into out[0 .. end - begin).
void draw_normals(uint64_t seed, uint64_t stream, int64_t begin, int64_t end, float stddev, float* out) {
  for (int64_t block = begin / 4; block * 4 < end; ++block) {
    const philox::Words words = philox::block(seed, stream, static_cast<uint64_t>(block));
    float z[4];
    normal_pair(words.w[0], words.w[1], z[0], z[1]);
    normal_pair(words.w[2], words.w[3], z[2], z[3]);
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t element = block * 4 + k;
      if (element >= begin && element < end) out[element - begin] = stddev * z[k];
    }
  }
}

// A stretch of one tensor's draws: the unit of work the threads share.
struct DrawChunk {
  uint64_t stream;
  float stddev;
  int64_t begin, end;  // elements of the tensor
  float* out;          // its element 0
};

constexpr int64_t kChunkElements = int64_t{1} << 18;

}  // namespace

std::vector<float> initial_parameters(const ParameterLayout& layout, uint64_t seed, const InitialValuesOf& rule) {
  std::vector<float> host(static_cast<size_t>(layout.total()), 0.0f);
  std::vector<DrawChunk> chunks;
  for (const ParameterInfo& entry : layout.entries()) {
    const InitialValues how = rule(entry);
    const int64_t count = entry.shape.numel();
    const int64_t drawn = how.stddev > 0.0f ? (how.drawn < 0 ? count : how.drawn) : 0;
    KILN_CHECK(drawn <= count, "initialising {}: {} draws for {} elements", entry.name, drawn, count);
    float* values = host.data() + entry.offset;
    std::fill(values + drawn, values + count, how.constant);
    for (int64_t begin = 0; begin < drawn; begin += kChunkElements)
      chunks.push_back({hash_string(entry.name), how.stddev, begin, std::min(drawn, begin + kChunkElements), values});
  }
  const auto n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < n; ++i) {
    const DrawChunk& c = chunks[static_cast<size_t>(i)];
    draw_normals(seed, c.stream, c.begin, c.end, c.stddev, c.out + c.begin);
  }
  return host;
}

}  // namespace kiln
