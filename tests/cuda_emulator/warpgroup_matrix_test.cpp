// The emulator's wgmma (warp_matrix_stand_in.cpp) through kiln's wrappers
// (kiln/backend/cuda/warpgroup_matrix.cuh): A fragments placed by the PTX ISA's formulas and B
// placed in shared memory by its canonical no-swizzle layouts (K-major and MN-major, each with its
// own LBO and SBO), restated here, multiply to the matrix product, with A from registers or from
// shared memory (K-major or M-major, by descriptor), with and without accumulation,
// and products issued back to back on the same accumulators chain; the accumulators are not
// readable before the wait; a product never waited for fails the launch.
#include "kiln/backend/cuda/warpgroup_matrix.cuh"

#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "matrix_test_values.h"

namespace {

using kiln::cuda::matrix_descriptor;
using kiln::cuda::warpgroup_commit;
using kiln::cuda::warpgroup_fence;
using kiln::cuda::warpgroup_multiply;
using kiln::cuda::warpgroup_wait;
using kiln::testing::bits_of;

constexpr int kRows = 64, kK = 16, kN = 64;
// The two B layouts' distances between core matrices (bytes): K-major LBO (along k) and SBO (along
// n), MN-major LBO (along k) and SBO (along n); deliberately unlike each other and not compact.
constexpr uint32_t kKMajorLeading = 1152, kKMajorStride = 144, kMnMajorLeading = 160, kMnMajorStride = 352;
constexpr uint32_t kALeading = 1280, kAStride = 160;  // A K-major in shared memory: along k, along m
constexpr uint32_t kMMajorLeading = 1152, kMMajorStride = 144;  // A M-major: along k, along m
constexpr size_t kMnMajorStart = 4096, kAStart = 8192, kMMajorStart = 12288, kSharedBytes = 16384;

size_t k_major_offset(int k, int n) {
  return n % 8 * 16 + n / 8 * kKMajorStride + k % 8 * 2 + k / 8 * kKMajorLeading;
}
size_t mn_major_offset(int k, int n) {
  return n % 8 * 2 + n / 8 * kMnMajorStride + k % 8 * 16 + k / 8 * kMnMajorLeading;
}
size_t a_offset(int m, int k) { return m % 8 * 16 + m / 8 * kAStride + k % 8 * 2 + k / 8 * kALeading; }
size_t m_major_offset(int m, int k) {
  return m % 8 * 2 + m / 8 * kMMajorStride + k % 8 * 16 + k / 8 * kMMajorLeading;
}

// d = a b (K-major b), d' = 1 + a b + a b (MN-major b, twice), d'' = a b (a too from shared
// memory, K-major) and d''' = a b (a from shared memory M-major, b MN-major), by one warpgroup;
// d_before_wait records what one accumulator held between the issue and the wait.
__global__ void multiply(float* d_k_major, float* d_mn_major, float* d_shared_a, float* d_m_major_a,
                         float* d_before_wait, const uint16_t* a, const uint16_t* b) {
  const int thread = static_cast<int>(threadIdx.x), warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, t = lane % 4;
  unsigned char* shared = ::cuda_emulator::dynamic_shared_memory();
  if (thread == 0)
    for (int k = 0; k < kK; ++k)
      for (int n = 0; n < kN; ++n) {
        std::memcpy(shared + k_major_offset(k, n), b + k * kN + n, 2);
        std::memcpy(shared + kMnMajorStart + mn_major_offset(k, n), b + k * kN + n, 2);
      }
  if (thread == 0)
    for (int m = 0; m < kRows; ++m)
      for (int k = 0; k < kK; ++k) {
        std::memcpy(shared + kAStart + a_offset(m, k), a + m * kK + k, 2);
        std::memcpy(shared + kMMajorStart + m_major_offset(m, k), a + m * kK + k, 2);
      }
  __syncthreads();
  const auto at = [&](int r, int c) { return static_cast<uint32_t>(a[(16 * warp + r) * kK + c]); };
  uint32_t a_regs[4];
  for (int i = 0; i < 4; ++i)  // rows g, g + 8, g, g + 8 of this warp's 16; columns 2t (+1), then + 8
    a_regs[i] = at(g + i % 2 * 8, 2 * t + i / 2 * 8) | at(g + i % 2 * 8, 2 * t + 1 + i / 2 * 8) << 16;
  float k_major[kN / 8][4], mn_major[kN / 8][4], shared_a[kN / 8][4], m_major_a[kN / 8][4];
  for (auto& chunk : mn_major)
    for (float& value : chunk) value = 1.0f;
  warpgroup_fence();
  warpgroup_multiply<__nv_bfloat16, kN, false>(k_major, a_regs,
                                               matrix_descriptor(shared, kKMajorLeading, kKMajorStride), false);
  for (int twice = 0; twice < 2; ++twice)
    warpgroup_multiply<__nv_bfloat16, kN, true>(
        mn_major, a_regs, matrix_descriptor(shared + kMnMajorStart, kMnMajorLeading, kMnMajorStride), true);
  warpgroup_multiply<__nv_bfloat16, kN, false, false>(shared_a,
                                                      matrix_descriptor(shared + kAStart, kALeading, kAStride),
                                                      matrix_descriptor(shared, kKMajorLeading, kKMajorStride), false);
  warpgroup_multiply<__nv_bfloat16, kN, true, true>(
      m_major_a, matrix_descriptor(shared + kMMajorStart, kMMajorLeading, kMMajorStride),
      matrix_descriptor(shared + kMnMajorStart, kMnMajorLeading, kMnMajorStride), false);
  warpgroup_commit();
  if (thread == 0) *d_before_wait = mn_major[0][0];
  warpgroup_wait<0>();
  for (int j = 0; j < kN / 8; ++j)
    for (int i = 0; i < 4; ++i) {  // row g + 8 (i / 2) of this warp's, column 8j + 2t + i % 2
      const int index = (16 * warp + g + i / 2 * 8) * kN + 8 * j + 2 * t + i % 2;
      d_k_major[index] = k_major[j][i];
      d_mn_major[index] = mn_major[j][i];
      d_shared_a[index] = shared_a[j][i];
      d_m_major_a[index] = m_major_a[j][i];
    }
}

__global__ void multiply_without_waiting(const uint16_t* b_unused) {
  (void)b_unused;
  unsigned char* shared = ::cuda_emulator::dynamic_shared_memory();
  std::memset(shared, 0, 1024);
  __syncthreads();
  const uint32_t a_regs[4] = {0, 0, 0, 0};
  float d[kN / 8][4] = {};
  warpgroup_fence();
  warpgroup_multiply<__nv_bfloat16, kN, false>(d, a_regs, matrix_descriptor(shared, 128, 1024), false);
  warpgroup_commit();
}

// A product of A from registers; `rewrite_before_wait`: those registers are changed after the issue
// and before the wait (on a GPU the tensor cores could read either value), else after the wait.
__global__ void rewrite_a_registers(bool rewrite_before_wait) {
  unsigned char* shared = ::cuda_emulator::dynamic_shared_memory();
  std::memset(shared, 0, kSharedBytes);
  __syncthreads();
  uint32_t a_regs[4] = {0, 0, 0, 0};
  float d[kN / 8][4] = {};
  warpgroup_fence();
  warpgroup_multiply<__nv_bfloat16, kN, false>(d, a_regs, matrix_descriptor(shared, 128, 1024), false);
  warpgroup_commit();
  if (rewrite_before_wait) a_regs[2] = 1;
  warpgroup_wait<0>();
  a_regs[3] = 1;  // after the wait: the registers are free again
}

TEST(CudaEmulatorWarpgroupMatrix, FragmentsAndSharedLayoutsMultiplyToTheProduct) {
  std::vector<uint16_t> a(kRows * kK), b(kK * kN);
  std::vector<float> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    af[i] = kiln::testing::matrix_a_value(i);
    a[i] = bits_of<__nv_bfloat16>(af[i]);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    bf[i] = kiln::testing::matrix_b_value(i);
    b[i] = bits_of<__nv_bfloat16>(bf[i]);
  }
  std::vector<float> k_major(kRows * kN, NAN), mn_major(kRows * kN, NAN), shared_a(kRows * kN, NAN),
      m_major_a(kRows * kN, NAN);
  float before_wait = 0.0f;
  cuda_emulator::launch(multiply, dim3(1), dim3(128), kSharedBytes, k_major.data(), mn_major.data(), shared_a.data(),
                        m_major_a.data(), &before_wait,
                        static_cast<const uint16_t*>(a.data()), static_cast<const uint16_t*>(b.data()));
  ASSERT_EQ(cuda_emulator::get_last_error(), 0) << cuda_emulator::failure();
  EXPECT_TRUE(std::isnan(before_wait)) << "an accumulator was readable before the wait";
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kN; ++c) {
      float expected = 0.0f;
      for (int k = 0; k < kK; ++k) expected += af[r * kK + k] * bf[k * kN + c];
      EXPECT_EQ(k_major[r * kN + c], expected) << "K-major, row " << r << ", column " << c;
      EXPECT_EQ(mn_major[r * kN + c], 1.0f + 2.0f * expected) << "MN-major, row " << r << ", column " << c;
      EXPECT_EQ(shared_a[r * kN + c], expected) << "A from shared memory, row " << r << ", column " << c;
      EXPECT_EQ(m_major_a[r * kN + c], expected) << "A M-major from shared memory, row " << r << ", column " << c;
    }
}

TEST(CudaEmulatorWarpgroupMatrix, AProductNeverWaitedForFailsTheLaunch) {
  cuda_emulator::launch(multiply_without_waiting, dim3(1), dim3(128), 1024, static_cast<const uint16_t*>(nullptr));
  EXPECT_NE(cuda_emulator::get_last_error(), 0);
  EXPECT_NE(cuda_emulator::failure().find("never waited for"), std::string::npos) << cuda_emulator::failure();
}

TEST(CudaEmulatorWarpgroupMatrix, ARegistersRewrittenBeforeTheWaitFailTheLaunch) {
  cuda_emulator::launch(rewrite_a_registers, dim3(1), dim3(128), kSharedBytes, false);
  EXPECT_EQ(cuda_emulator::get_last_error(), 0) << cuda_emulator::failure();
  cuda_emulator::launch(rewrite_a_registers, dim3(1), dim3(128), kSharedBytes, true);
  EXPECT_NE(cuda_emulator::get_last_error(), 0);
  EXPECT_NE(cuda_emulator::failure().find("A registers (lane 0) were rewritten before the wait"), std::string::npos)
      << cuda_emulator::failure();
}

}  // namespace
