// Multi-head self-attention core in its textbook matrix form: per (batch, head),
//   S = q k^T / sqrt(HS), masked;  P = softmax(S) (kept for backward);  out = P v.
// The T x T products run through BLAS (single-threaded inside the per-head OpenMP loop); the
// CUDA back-end replaces this with a fused flash-attention kernel tested against this file.
//
// Backward, with dO the output gradient:
//   dP = dO v^T;  dS = P * (dP - rowsum(P * dP)) / sqrt(HS);  dq = dS k;  dk = dS^T q;  dv = P^T dO.
// Each (batch, head) pair is owned by one thread and writes only its own slices, so no races.
#include <cblas.h>

#include <cmath>
#include <limits>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {
namespace {

// Masks and soft-maxes one row of scores in place; a row with no visible key becomes all zeros.
void masked_softmax_row(float* row, int64_t T, int64_t last_key, const int32_t* key_mask) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t t2 = 0; t2 < T; ++t2) {
    const bool visible = t2 <= last_key && (key_mask == nullptr || key_mask[t2] != 0);
    if (!visible) row[t2] = -std::numeric_limits<float>::infinity();
    max_score = std::max(max_score, row[t2]);
  }
  if (max_score == -std::numeric_limits<float>::infinity()) {
    for (int64_t t2 = 0; t2 < T; ++t2) row[t2] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t t2 = 0; t2 < T; ++t2) {
    row[t2] = std::exp(row[t2] - max_score);  // exp(-inf) = 0 for masked keys
    sum += row[t2];
  }
  const float inverse_sum = 1.0f / sum;
  for (int64_t t2 = 0; t2 < T; ++t2) row[t2] *= inverse_sum;
}


void attention_forward_fp32(const AttentionForward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_forward(args, Device::CPU);
  const bool causal = args.mask != AttentionMask::KeyPadding;
  const bool padded = args.mask != AttentionMask::Causal;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  float* out = args.out.as<float>();
  float* probs = args.probs.as<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * 3 * C + h * HS;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* p = probs + (b * NH + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, 3 * C, k, 3 * C, 0.0f,
                  p, T);
      const int32_t* key_mask = padded ? args.key_mask.as<int32_t>() + b * T : nullptr;
      for (int64_t t = 0; t < T; ++t) masked_softmax_row(p + t * T, T, causal ? t : T - 1, key_mask);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, v, 3 * C, 0.0f,
                  out + b * T * C + h * HS, C);
    }
  }
}
}  // namespace

void CpuBackend::attention_forward(const AttentionForward& args) {
  checks::attention_forward(args, Device::CPU);
  Fp32Scope f(scratch_);
  attention_forward_fp32({f.output(args.out), f.output(args.probs), f.input(args.qkv), args.key_mask, args.num_heads, args.mask});
  f.write_back();
}

namespace {
void attention_backward_fp32(const AttentionBackward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_backward(args, Device::CPU);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  const float* dout = args.dout.as<float>();
  const float* probs = args.probs.as<float>();
  float* dqkv = args.dqkv.as<float>();
  float* dprobs = args.dprobs.as<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t offset = b * T * 3 * C + h * HS;
      const float *q = qkv + offset, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + offset, *dk = dq + C, *dv = dq + 2 * C;
      const float* p = probs + (b * NH + h) * T * T;
      float* ds = dprobs + (b * NH + h) * T * T;
      const float* d_o = dout + b * T * C + h * HS;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, d_o, C, v, 3 * C, 0.0f, ds, T);
      for (int64_t t = 0; t < T; ++t) {  // dP -> dS in place
        const float* p_row = p + t * T;
        float* row = ds + t * T;
        float weighted = 0.0f;
        for (int64_t t2 = 0; t2 < T; ++t2) weighted += p_row[t2] * row[t2];
        for (int64_t t2 = 0; t2 < T; ++t2) row[t2] = p_row[t2] * (row[t2] - weighted) * scale;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, k, 3 * C, 0.0f, dq, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, q, 3 * C, 0.0f, dk, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, d_o, C, 0.0f, dv, 3 * C);
    }
  }
}
}  // namespace

void CpuBackend::attention_backward(const AttentionBackward& args) {
  checks::attention_backward(args, Device::CPU);
  Fp32Scope f(scratch_);
  attention_backward_fp32({f.output(args.dqkv), f.output(args.dprobs), f.input(args.dout), f.input(args.qkv), f.input(args.probs), args.num_heads});
  f.write_back();
}

}  // namespace kiln
