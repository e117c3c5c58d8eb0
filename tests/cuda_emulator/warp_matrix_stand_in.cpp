// The emulator's ldmatrix and mma.sync (cuda_emulator.h), with the fragment layouts of the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type"; ldmatrix), as
// kiln/backend/cuda/warp_matrix.cuh restates them. Both are warp-wide: every lane publishes its
// operands, the last lane to arrive computes for the warp into the warp's scratch, and each lane
// then reads its own part.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

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

}  // namespace cuda_emulator
