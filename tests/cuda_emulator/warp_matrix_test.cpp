// The emulator's PTX matrix instructions and asynchronous copies (warp_matrix_stand_in.cpp),
// through kiln's own wrappers (kiln/backend/cuda/warp_matrix.cuh): fragments placed by the PTX
// ISA's layout formulas, restated here, multiply to the matrix product; ldmatrix, plain and
// transposed, places shared-memory tiles in those same layouts; copies land when waited for; misuse
// fails.
#include "kiln/backend/cuda/warp_matrix.cuh"

#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "matrix_test_values.h"

namespace {

using kiln::cuda::copy_async_16;
using kiln::cuda::copy_commit;
using kiln::cuda::copy_wait;
using kiln::cuda::load_matrices;
using kiln::cuda::load_matrices_transposed;
using kiln::cuda::mma_16x8x16;
using kiln::testing::bits_of;

uint32_t pair(uint16_t low, uint16_t high) {
  return static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16;
}

// d [16][16] = a [16][16] b [16][16] twice, by one warp: `by_formula` from registers filled by the
// PTX ISA's formulas (groupID g = lane / 4, t = lane % 4), `by_ldmatrix` from shared memory through
// ldmatrix (b from its rows [k][n] transposed, and from b^T [n][k] untransposed; both halves).
template <typename T>
__global__ void multiply(float* by_formula, float* by_ldmatrix, const uint16_t* a,
                         const uint16_t* b, const uint16_t* b_transposed) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  const auto at = [](const uint16_t* m, int r, int c) { return m[r * 16 + c]; };
  uint32_t a_regs[4];
  for (int i = 0; i < 4; ++i)  // a0..a7: rows g, g + 8, g, g + 8; columns 2t (+1), then + 8
    a_regs[i] =
        pair(at(a, g + i % 2 * 8, 2 * t + i / 2 * 8), at(a, g + i % 2 * 8, 2 * t + 1 + i / 2 * 8));
  for (int n_tile = 0; n_tile < 2; ++n_tile) {
    const int n = n_tile * 8 + g;
    const uint32_t b_regs[2] = {pair(at(b, 2 * t, n), at(b, 2 * t + 1, n)),
                                pair(at(b, 2 * t + 8, n), at(b, 2 * t + 9, n))};
    float d[4] = {0, 0, 0, 0};
    mma_16x8x16<T>(d, a_regs, b_regs);
    for (int i = 0; i < 4; ++i)  // c0..c3: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
      by_formula[(g + i / 2 * 8) * 16 + n_tile * 8 + 2 * t + i % 2] = d[i];
  }

  // The same through shared memory: a, b and b^T, 16 rows of 32 bytes each, by cp.async.
  auto* tiles = reinterpret_cast<uint16_t*>(::cuda_emulator::dynamic_shared_memory());
  const uint16_t* sources[3] = {a, b, b_transposed};
  for (int chunk = lane; chunk < 3 * 32; chunk += 32)  // 32 chunks of 16 bytes per matrix
    copy_async_16(tiles + chunk * 8, sources[chunk / 32] + chunk % 32 * 8, true);
  copy_commit();
  copy_wait<0>();
  __syncwarp();
  uint32_t a_frag[4], b_frag[4], bt_frag[4];
  load_matrices(a_frag, tiles + (lane % 16) * 16 + lane / 16 * 8);
  load_matrices_transposed(b_frag,
                           tiles + 256 + (lane % 8 + lane / 8 % 2 * 8) * 16 + lane / 16 * 8);
  load_matrices(bt_frag, tiles + 512 + (lane % 8 + lane / 16 * 8) * 16 + lane / 8 % 2 * 8);
  for (int i = 0; i < 4; ++i)
    if (b_frag[i] != bt_frag[i]) by_ldmatrix[0] = NAN;  // the two routes must agree exactly
  for (int n_tile = 0; n_tile < 2; ++n_tile) {
    const uint32_t b_regs[2] = {b_frag[2 * n_tile], b_frag[2 * n_tile + 1]};
    float d[4] = {0, 0, 0, 0};
    mma_16x8x16<T>(d, a_frag, b_regs);
    for (int i = 0; i < 4; ++i)
      by_ldmatrix[(g + i / 2 * 8) * 16 + n_tile * 8 + 2 * t + i % 2] += d[i];
  }
}

template <typename T>
void expect_products() {
  std::vector<uint16_t> a(256), b(256), bt(256);
  std::vector<float> af(256), bf(256);
  for (int i = 0; i < 256; ++i) {
    af[i] = kiln::testing::matrix_a_value(static_cast<size_t>(i));
    bf[i] = kiln::testing::matrix_b_value(static_cast<size_t>(i));
    a[i] = bits_of<T>(af[i]);
    b[i] = bits_of<T>(bf[i]);
  }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) bt[n * 16 + k] = b[k * 16 + n];
  std::vector<float> by_formula(256, NAN), by_ldmatrix(256, 0.0f);
  cuda_emulator::launch(multiply<T>, dim3(1), dim3(32), 3 * 512, by_formula.data(),
                        by_ldmatrix.data(), a.data(), b.data(), bt.data());
  ASSERT_EQ(cuda_emulator::get_last_error(), 0) << cuda_emulator::failure();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      float expected = 0.0f;
      for (int k = 0; k < 16; ++k) expected += af[r * 16 + k] * bf[k * 16 + c];
      EXPECT_EQ(by_formula[r * 16 + c], expected) << "row " << r << ", column " << c;
      EXPECT_EQ(by_ldmatrix[r * 16 + c], expected) << "row " << r << ", column " << c;
    }
}

TEST(CudaEmulatorWarpMatrix, FragmentsInTheDocumentedLayoutsMultiplyToTheProduct) {
  expect_products<__nv_bfloat16>();
  expect_products<__half>();
}

// Thread 0 copies 16 bytes (and 16 zeros) and records what its destination holds before and after
// waiting.
__global__ void copy_and_look(unsigned char* seen, const unsigned char* source) {
  unsigned char* shared = ::cuda_emulator::dynamic_shared_memory();
  if (threadIdx.x != 0) return;
  copy_async_16(shared, source, true);
  copy_async_16(shared + 16, source, false);
  copy_commit();
  std::memcpy(seen, shared, 32);
  copy_wait<0>();
  std::memcpy(seen + 32, shared, 32);
}

__global__ void ldmatrix_from_global(const uint16_t* global) {
  uint32_t r[4];
  load_matrices(r, global + threadIdx.x * 8);
}

TEST(CudaEmulatorWarpMatrix, CopiesLandWhenWaitedForAndSharedMemoryIsChecked) {
  std::vector<unsigned char> source(16), seen(64);
  for (int i = 0; i < 16; ++i) source[i] = static_cast<unsigned char>(i + 1);
  alignas(16) unsigned char aligned[16];
  std::memcpy(aligned, source.data(), 16);
  cuda_emulator::launch(copy_and_look, dim3(1), dim3(32), 64, seen.data(),
                        static_cast<const unsigned char*>(aligned));
  ASSERT_EQ(cuda_emulator::get_last_error(), 0) << cuda_emulator::failure();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(seen[i], 0xFF) << "byte " << i << " before the wait";
  for (int i = 0; i < 16; ++i) EXPECT_EQ(seen[32 + i], i + 1) << "byte " << i << " after the wait";
  for (int i = 16; i < 32; ++i) EXPECT_EQ(seen[32 + i], 0) << "zero-filled byte " << i;

  alignas(16) uint16_t global[32 * 8] = {};
  cuda_emulator::launch(ldmatrix_from_global, dim3(1), dim3(32), 0,
                        static_cast<const uint16_t*>(global));
  EXPECT_NE(cuda_emulator::get_last_error(), 0);
  EXPECT_NE(cuda_emulator::failure().find(
                "ldmatrix addresses memory outside the block's dynamic shared memory"),
            std::string::npos)
      << cuda_emulator::failure();
}

}  // namespace
