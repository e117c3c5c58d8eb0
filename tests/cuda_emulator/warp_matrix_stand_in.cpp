// The emulator's ldmatrix, mma.sync and wgmma (cuda_emulator.h), with the fragment layouts of the
// PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"; ldmatrix; "Asynchronous
// Warpgroup Level Matrix" register fragments and shared memory layouts), as
// kiln/backend/cuda/warp_matrix.cuh and warpgroup_matrix.cuh restate them. All are warp-wide: every
// lane publishes its operands, the last lane to arrive computes for the warp (wgmma: queues the
// product, which runs at the wait), and each lane then reads its own part.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emulator.h"

namespace cuda_emulator {
namespace {

uint16_t element(uint32_t pair, int which) { return static_cast<uint16_t>(pair >> (16 * which)); }

float widen(uint16_t bits, bool bf16) {
  if (bf16) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    return value;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

uint16_t at(const void* row, int column) {
  uint16_t value;
  std::memcpy(&value, static_cast<const unsigned char*>(row) + 2 * column, sizeof(value));
  return value;
}

}  // namespace

void load_matrices(uint32_t (&r)[4], const void* row, bool transposed) {
  check_shared(row, 16, 16, "ldmatrix");
  struct Operands {
    const void* row;
    bool transposed;
  };
  const Operands mine{row, transposed};
  // Matrix j's row q is at lane 8j + q's address; lane 4r + w gets, as register j, elements
  // 2w and 2w + 1 of row r (transposed: of column r, i.e. rows 2w and 2w + 1 at column r).
  const auto load = [](const void* const* lanes, float* scratch) {
    const auto* first = static_cast<const Operands*>(lanes[0]);
    for (int l = 0; l < 32; ++l)
      if (static_cast<const Operands*>(lanes[l])->transposed != first->transposed)
        fail("lanes of one ldmatrix disagree on .trans");
    const auto row_of = [&](int matrix, int q) {
      return static_cast<const Operands*>(lanes[8 * matrix + q])->row;
    };
    for (int lane = 0; lane < 32; ++lane)
      for (int matrix = 0; matrix < 4; ++matrix) {
        const int r = lane / 4, w = lane % 4;
        const uint16_t low =
            first->transposed ? at(row_of(matrix, 2 * w), r) : at(row_of(matrix, r), 2 * w);
        const uint16_t high =
            first->transposed ? at(row_of(matrix, 2 * w + 1), r) : at(row_of(matrix, r), 2 * w + 1);
        const uint32_t pair = static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16;
        std::memcpy(scratch + 4 * lane + matrix, &pair, sizeof(pair));
      }
  };
  gather(&mine, load);
  std::memcpy(r, warp_scratch() + 4 * lane(), sizeof(r));
}

void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  struct Operands {
    const uint32_t* a;
    const uint32_t* b;
    const float* c;
    bool bf16;
  };
  const Operands mine{a, b, d, bf16};
  const auto multiply = [](const void* const* lanes, float* scratch) {
    float ma[16][16], mb[16][8], mc[16][8];
    const bool bf16_inputs = static_cast<const Operands*>(lanes[0])->bf16;
    for (int lane = 0; lane < 32; ++lane) {
      const auto& operands = *static_cast<const Operands*>(lanes[lane]);
      if (operands.bf16 != bf16_inputs) fail("lanes of one mma.sync disagree on the input type");
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 8; ++i) {  // a_i: register i / 2, half i % 2
        const int row = g + ((i / 2) % 2) * 8, column = 2 * t + (i % 2) + (i / 4) * 8;
        ma[row][column] = widen(element(operands.a[i / 2], i % 2), bf16_inputs);
      }
      for (int i = 0; i < 4; ++i)  // b_i: rows 2t, 2t + 1, then 2t + 8, 2t + 9 of column g
        mb[2 * t + (i % 2) + (i / 2) * 8][g] =
            widen(element(operands.b[i / 2], i % 2), bf16_inputs);
      for (int i = 0; i < 4; ++i) mc[g + (i / 2) * 8][2 * t + i % 2] = operands.c[i];
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        const int row = g + (i / 2) * 8, column = 2 * t + i % 2;
        float sum = mc[row][column];
        for (int k = 0; k < 16; ++k) sum += ma[row][k] * mb[k][column];
        scratch[4 * lane + i] = sum;
      }
    }
  };
  gather(&mine, multiply);  // every lane's c is read before any lane writes its d (they alias)
  std::memcpy(d, warp_scratch() + 4 * lane(), sizeof(d));
}

namespace {

// Where element (k, n) of a [16 x n] B operand (or (k, m) of an A from shared memory) lies, in
// bytes from the descriptor's start, for the PTX ISA's canonical layouts without swizzle ("Shared
// Memory Matrix Layout"; the same as CUTLASS's GMMA descriptor comments state), 2-byte elements
// (T = 8 to 16 bytes), LBO and SBO the descriptor's leading and stride byte offsets:
//   K-major  ((8,m),(T,2k)):((1T,SBO),(1,LBO))   row n of a core matrix is 16 bytes of k
//   MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) row k of a core matrix is 16 bytes of n
size_t operand_b_offset(int k, int n, size_t leading, size_t stride, bool mn_major) {
  const auto at = [](int i) { return static_cast<size_t>(i); };
  return mn_major ? at(n % 8) * 2 + at(n / 8) * stride + at(k % 8) * 16 + at(k / 8) * leading
                  : at(n % 8) * 16 + at(n / 8) * stride + at(k % 8) * 2 + at(k / 8) * leading;
}

}  // namespace

namespace {

// One wgmma for the calling warp: A from `a` (registers) or, when `a` is null, from shared memory
// by `a_descriptor` (K-major, or M-major when transpose_a).
struct WarpgroupProduct {
  float* d;
  const uint32_t* a;
  uint64_t a_descriptor, b_descriptor;
  int n;
  bool transpose_a, transpose_b, bf16, accumulate;
  bool operator==(const WarpgroupProduct& other) const {
    return (a == nullptr) == (other.a == nullptr) && a_descriptor == other.a_descriptor &&
           b_descriptor == other.b_descriptor && n == other.n && transpose_a == other.transpose_a &&
           transpose_b == other.transpose_b && bf16 == other.bf16 && accumulate == other.accumulate;
  }
};

struct Descriptor {
  const unsigned char* start;
  size_t leading, stride;
  explicit Descriptor(uint64_t bits)
      : start(dynamic_shared_memory() + ((bits & 0x3fffu) << 4)),
        leading((bits >> 16 & 0x3fffu) << 4),
        stride((bits >> 32 & 0x3fffu) << 4) {}
  float element(int k, int n, bool mn_major, bool bf16, const char* what) const {
    const unsigned char* where = start + operand_b_offset(k, n, leading, stride, mn_major);
    check_shared(where, 2, 2, what);
    return widen(at(where, 0), bf16);
  }
};

void check_descriptor(uint64_t bits) {
  if (bits >> 62 != 0 || (bits >> 49 & 7u) != 0)
    fail("a wgmma descriptor with a swizzle or base offset (the emulator has no-swizzle layouts only)");
}

void issue_warpgroup_product(const WarpgroupProduct& mine) {
  const dim3& shape = block_dim();
  if (shape.x * shape.y * shape.z % 128 != 0)
    fail("wgmma in a block that is not made of whole warpgroups (128 threads)");
  if (mine.n < 8 || mine.n > 256 || mine.n % 8 != 0) fail("wgmma with N = " + std::to_string(mine.n));
  check_descriptor(mine.b_descriptor);
  if (mine.a == nullptr) check_descriptor(mine.a_descriptor);
  const uint3& index = thread_index();
  const int warp_in_group = static_cast<int>((index.x + index.y * shape.x + index.z * shape.x * shape.y) / 32 % 4);
  const auto issue = [warp_in_group](const void* const* lanes, float*) {
    const auto& first = *static_cast<const WarpgroupProduct*>(lanes[0]);
    const int columns = first.n;
    // A [16 x 16] of this warp's rows when in registers (the mma.sync m16n8k16 A layout), each
    // lane's accumulator registers, and C when `accumulate`: their values now, or, when an earlier
    // product on the same accumulators is pending, its result (read when this one runs, after it).
    std::vector<float> ma(first.a ? 16 * 16 : 0), c(static_cast<size_t>(16 * columns), 0.0f);
    std::vector<float*> accumulators(32);
    // Each lane's A registers, where they are and what they held: the tensor cores read them until
    // the wait that covers the product, so they must hold the same then (PTX ISA, wgmma.mma_async).
    std::vector<const uint32_t*> a_registers(first.a ? 32 : 0);
    std::vector<std::array<uint32_t, 4>> a_values(a_registers.size());
    const bool chained = warp_work_pending(first.d);
    for (int lane = 0; lane < 32; ++lane) {
      const auto& operands = *static_cast<const WarpgroupProduct*>(lanes[lane]);
      if (!(operands == first)) fail("lanes of one wgmma disagree on its operands");
      const int g = lane / 4, t = lane % 4;
      if (first.a) {
        a_registers[static_cast<size_t>(lane)] = operands.a;
        std::memcpy(a_values[static_cast<size_t>(lane)].data(), operands.a, sizeof(uint32_t) * 4);
        for (int i = 0; i < 8; ++i)
          ma[static_cast<size_t>((g + (i / 2) % 2 * 8) * 16 + 2 * t + i % 2 + i / 4 * 8)] =
              widen(element(operands.a[i / 2], i % 2), first.bf16);
      }
      accumulators[static_cast<size_t>(lane)] = operands.d;
      for (int j = 0; j < columns / 8; ++j)
        for (int i = 0; i < 4; ++i) {
          float& value = operands.d[4 * j + i];
          if (first.accumulate && !chained)
            c[static_cast<size_t>((g + i / 2 * 8) * columns + 8 * j + 2 * t + i % 2)] = value;
          if (!chained) value = std::numeric_limits<float>::quiet_NaN();  // in use until the wait
        }
    }
    queue_warp_work(first.d, [ma, c, accumulators, a_registers, a_values, first, columns, chained, warp_in_group] {
      for (size_t lane = 0; lane < a_registers.size(); ++lane)
        if (std::memcmp(a_registers[lane], a_values[lane].data(), sizeof(uint32_t) * 4) != 0)
          fail("wgmma's A registers (lane " + std::to_string(lane) +
               ") were rewritten before the wait that covers the product, which reads them until then");
      std::vector<float> a_rows = ma, mb(static_cast<size_t>(16 * columns));
      if (!first.a) {  // this warp's 16 rows of the A tile
        a_rows.resize(16 * 16);
        const Descriptor a(first.a_descriptor);
        for (int row = 0; row < 16; ++row)
          for (int k = 0; k < 16; ++k)
            a_rows[static_cast<size_t>(row * 16 + k)] =
                a.element(k, 16 * warp_in_group + row, first.transpose_a, first.bf16, "wgmma's A operand");
      }
      const Descriptor b(first.b_descriptor);
      for (int k = 0; k < 16; ++k)
        for (int column = 0; column < columns; ++column)
          mb[static_cast<size_t>(k * columns + column)] =
              b.element(k, column, first.transpose_b, first.bf16, "wgmma's B operand");
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < columns / 8; ++j)
          for (int i = 0; i < 4; ++i) {
            const int row = g + i / 2 * 8, column = 8 * j + 2 * t + i % 2;
            float& accumulator = accumulators[static_cast<size_t>(lane)][4 * j + i];
            float sum = !first.accumulate ? 0.0f
                        : chained         ? accumulator
                                          : c[static_cast<size_t>(row * columns + column)];
            for (int k = 0; k < 16; ++k)
              sum += a_rows[static_cast<size_t>(row * 16 + k)] * mb[static_cast<size_t>(k * columns + column)];
            accumulator = sum;
          }
      }
    });
  };
  gather(&mine, issue);
}

}  // namespace

void warpgroup_multiply(float* d, int n, const uint32_t (&a)[4], uint64_t b_descriptor,
                        bool transpose_b, bool bf16, bool accumulate) {
  issue_warpgroup_product({d, a, 0, b_descriptor, n, false, transpose_b, bf16, accumulate});
}

void warpgroup_multiply_shared_a(float* d, int n, uint64_t a_descriptor, uint64_t b_descriptor,
                                 bool transpose_a, bool transpose_b, bool bf16, bool accumulate) {
  issue_warpgroup_product({d, nullptr, a_descriptor, b_descriptor, n, transpose_a, transpose_b, bf16, accumulate});
}

}  // namespace cuda_emulator
