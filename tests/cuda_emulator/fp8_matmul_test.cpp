// cuda::LtMatmul's fp8 E4M3 products (the `kiln bench gemm --dtype fp8` ceiling) on the emulator's
// cuBLASLt, which holds calls to cuBLASLt's documented fp8 requirements ("TN" layout, compute
// type 32F, a 16- or 32-bit result): the row-major A [M,K] x B [N,K]^T that LtMatmul maps onto
// that layout computes the product of the decoded values, and any other layout is refused with an
// error that says which one fp8 takes, before cuBLASLt is asked.
#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "device_memory.h"
#include "kiln/backend/cuda/lt_matmul.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/dtype.h"
#include "kiln/core/rng.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 32, N = 48, K = 64;

std::vector<uint8_t> random_fp8(int64_t count, Rng& rng) {
  std::vector<uint8_t> codes(static_cast<size_t>(count));
  for (uint8_t& code : codes) code = float_to_fp8_e4m3(rng.normal(0.0f, 3.0f));
  return codes;
}

class EmulatedFp8Matmul : public ::testing::Test {
 protected:
  EmulatedFp8Matmul() : lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes) {
    Rng rng(11);
    a = random_fp8(M * K, rng);
    b = random_fp8(N * K, rng);
    EXPECT_EQ(cudaMemcpy(a_device.data, a.data(), a.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(b_device.data, b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // C [M,N] bf16 = A [M,K] B [N,K]^T, both fp8 E4M3 and K-contiguous.
  cuda::Gemm tn_product() const {
    cuda::Gemm gemm;
    gemm.types = {DType::F8E4M3, DType::BF16};
    gemm.trans_b = true;
    gemm.M = M, gemm.N = N, gemm.K = K;
    gemm.A = a_device.data, gemm.lda = K;
    gemm.B = b_device.data, gemm.ldb = K;
    gemm.C = c_device.data, gemm.ldc = N;
    return gemm;
  }

  DeviceMemory workspace{cuda::LtMatmul::kWorkspaceBytes};
  DeviceMemory a_device{M * K}, b_device{N * K}, c_device{M * N * 2};
  cuda::LtMatmul lt;
  std::vector<uint8_t> a, b;
};

TEST_F(EmulatedFp8Matmul, TnProductIsTheProductOfTheDecodedValues) {
  ASSERT_TRUE(lt.run(tn_product()));
  std::vector<uint16_t> c(M * N);
  ASSERT_EQ(cudaStreamSynchronize(cuda::compute_stream()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(c.data(), c_device.data, c.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  double largest = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double expected = 0;
      for (int64_t k = 0; k < K; ++k)
        expected += double{fp8_e4m3_to_float(a[m * K + k])} * fp8_e4m3_to_float(b[n * K + k]);
      largest = std::max(largest, std::fabs(expected));
      // fp32 accumulation, then one rounding to bf16 (8 significant bits).
      EXPECT_NEAR(bf16_to_float(c[m * N + n]), expected, std::fabs(expected) * 0x1p-8 + 1e-3)
          << "C[" << m << ", " << n << "]";
    }
  EXPECT_GT(largest, 10.0);  // the inputs were not all (near) zero
}

TEST_F(EmulatedFp8Matmul, OtherLayoutsAreRefusedByName) {
  cuda::Gemm nn = tn_product();
  nn.trans_b = false;
  nn.ldb = N;
  EXPECT_NE(error_of([&] { lt.run(nn); }).find("an fp8 product takes A [M,K] and B [N,K]"),
            std::string::npos);
  cuda::Gemm fp8_out = tn_product();
  fp8_out.types.output = DType::F8E4M3;
  EXPECT_NE(error_of([&] { lt.run(fp8_out); }).find("output fp8_e4m3"), std::string::npos);
}

// Fast accumulation is an fp8 product's alone: asked of another, the call is refused by name.
TEST_F(EmulatedFp8Matmul, FastAccumulationIsForFp8ProductsAlone) {
  cuda::Gemm fast = tn_product();
  fast.fast_accumulation = true;
  EXPECT_TRUE(lt.run(fast));
  cuda::Gemm bf16 = fast;
  bf16.types = {DType::BF16, DType::BF16};
  EXPECT_NE(error_of([&] { lt.run(bf16); }).find("fast accumulation is for fp8 products, not bf16 inputs"),
            std::string::npos);
}

// A product cuBLASLt has no algorithm for is named whole in the error: rows of 24 fp8 bytes are not
// 16-byte multiples, which the emulator's heuristic refuses as cuBLASLt's does.
TEST_F(EmulatedFp8Matmul, AProductWithoutAnAlgorithmIsNamed) {
  cuda::Gemm narrow = tn_product();
  narrow.K = 24, narrow.lda = 24, narrow.ldb = 24;
  const std::string error = error_of([&] { lt.run(narrow); });
  EXPECT_NE(error.find("cuBLASLt has no algorithm for the 32 x 48 x 24 product (trans_a false, trans_b true, "
                       "lda 24, ldb 24, ldc 48, batch 1; fp8_e4m3 x fp8_e4m3 inputs, bf16 output"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find("fast accumulation"), std::string::npos) << error;
  narrow.fast_accumulation = true;  // the error then says so, and how to run without it
  const std::string fast = error_of([&] { lt.run(narrow); });
  EXPECT_NE(fast.find("; fast accumulation): CUBLAS_STATUS_NOT_SUPPORTED (emulator) (--no-fp8-fast-accumulation "
                      "runs the fp8 forward products without it)"),
            std::string::npos)
      << fast;
}

// Factors less than 16-byte aligned are refused by name before cuBLASLt sees them (an H100's
// cuBLASLt refused them when run; lt_matmul.h); 16-byte aligned ones scale the product.
TEST_F(EmulatedFp8Matmul, ScaleFactorsMustBe16ByteAligned) {
  ASSERT_TRUE(lt.run(tn_product()));
  std::vector<uint16_t> plain(M * N), scaled(M * N);
  ASSERT_EQ(cudaStreamSynchronize(cuda::compute_stream()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(plain.data(), c_device.data, plain.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  DeviceMemory factors{64};
  const float values[8] = {0.5f, 0.5f, 0.0f, 0.0f, 0.25f, 0.0f, 0.0f, 0.0f};  // at bytes 0, 4 and 16
  ASSERT_EQ(cudaMemcpy(factors.data, values, sizeof(values), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::Gemm product = tn_product();
  product.a_scale = static_cast<const float*>(factors.data) + 1;
  product.b_scale = static_cast<const float*>(factors.data) + 4;
  const std::string error = error_of([&] { lt.run(product); });
  EXPECT_NE(error.find("fp8 scale factors must be 16-byte aligned for cuBLASLt; A's is aligned to 4 bytes, B's to "
                       "16, for the 32 x 48 x 64 product"),
            std::string::npos)
      << error;
  product.a_scale = static_cast<const float*>(factors.data);
  ASSERT_TRUE(lt.run(product));
  ASSERT_EQ(cudaStreamSynchronize(cuda::compute_stream()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scaled.data(), c_device.data, scaled.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < plain.size(); ++i)  // x 1/8: exact in bf16
    EXPECT_EQ(bf16_to_float(scaled[i]), bf16_to_float(plain[i]) / 8) << "C element " << i;
}

}  // namespace
}  // namespace kiln::testing
