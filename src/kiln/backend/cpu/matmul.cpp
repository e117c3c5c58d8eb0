// Matrix multiply with optional bias, through BLAS sgemm (row-major). Forward seeds the output
// with the bias and lets sgemm accumulate onto it (beta = 1), saving a pass. Backward computes
// din with beta = 0 (activation gradient, written) and dweight with beta = 1 (parameter
// gradient, accumulated), matching the conventions in ops.h. The GELU fusions are, in the
// reference, the GELU op after the product (forward) or on din (backward).
#include <cblas.h>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

namespace {
void matmul_forward_fp32(const MatmulForward& args) {
  const auto [M, K, N] = checks::matmul_forward(args, Device::CPU);
  float* out = args.out.as<float>();
  float beta = 0.0f;
  if (!args.bias.empty()) {
    const float* bias = args.bias.as<float>();
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) out[m * N + n] = bias[n];
    beta = 1.0f;
  }
  const bool transposed = args.layout == WeightLayout::OutIn;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transposed ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
              args.in.as<float>(), K, args.weight.as<float>(), transposed ? K : N, beta, out, N);
}
}  // namespace

void CpuBackend::matmul_forward(const MatmulForward& args) {
  checks::matmul_forward(args, Device::CPU);
  {
    Fp32Scope f(scratch_);
    matmul_forward_fp32({f.output(args.out), f.input(args.in), f.input(args.weight), f.input(args.bias), args.layout});
    f.write_back();
  }
  if (!args.gelu_out.empty()) gelu_forward({args.gelu_out, args.out});  // the reference: the two ops in turn
}

namespace {
void matmul_backward_fp32(const MatmulBackward& args) {
  const auto [M, K, N] = checks::matmul_backward(args, Device::CPU);
  const float* dout = args.dout.as<float>();
  const float* in = args.in.as<float>();
  const float* weight = args.weight.as<float>();
  const bool in_out = args.layout == WeightLayout::InOut;
  if (!args.din.empty()) {
    // din[M,K] = dout[M,N] @ W^T where W is [K,N] (InOut), or dout @ W where W is [N,K] (OutIn).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, in_out ? CblasTrans : CblasNoTrans, M, K, N, 1.0f, dout,
                N, weight, in_out ? N : K, 0.0f, args.din.as<float>(), K);
  }
  if (in_out) {  // dW[K,N] += in^T @ dout
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1.0f, in, K, dout, N, 1.0f,
                args.dweight.as<float>(), N);
  } else {       // dW[N,K] += dout^T @ in
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, in, K, 1.0f,
                args.dweight.as<float>(), K);
  }
  if (!args.dbias.empty()) {
    float* dbias = args.dbias.as<float>();
    constexpr int64_t kColumnBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += kColumnBlock) {
      const int64_t n1 = std::min(N, n0 + kColumnBlock);
      float sums[kColumnBlock] = {};
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) sums[n - n0] += dout[m * N + n];
      for (int64_t n = n0; n < n1; ++n) dbias[n] += sums[n - n0];
    }
  }
}
}  // namespace

void CpuBackend::matmul_backward(const MatmulBackward& args) {
  checks::matmul_backward(args, Device::CPU);
  {
    Fp32Scope f(scratch_);
    matmul_backward_fp32({f.output(args.din), args.dweight, args.dbias, f.input(args.dout),
                          f.input(args.in), f.input(args.weight), args.layout});
    f.write_back();
  }
  if (!args.gelu_in.empty()) gelu_backward({args.din, args.gelu_in, args.din});  // in place
}

}  // namespace kiln
