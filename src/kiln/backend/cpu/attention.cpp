// Multi-head self-attention core, the plain way: per (batch, head) the T x T score matrix is
// formed, masked, soft-maxed and kept (probs) for backward. The CUDA back-end replaces this with
// a fused flash-attention kernel; this file is the oracle it is tested against.
//
// Backward per row t, with P = probs and dP = dout . v^T:
//   dS = P * (dP - sum_j P_j dP_j);  dq = dS k / sqrt(HS);  dk += dS^T q / sqrt(HS);  dv += P^T dout.
// Each (batch, head) pair is owned by one thread and touches only its own slices, so no races.
#include <cmath>
#include <limits>

#include "kiln/backend/cpu/checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {
namespace {

struct AttentionShape {
  int64_t B, T, C, NH, HS;
};

AttentionShape attention_shape(const Tensor& qkv, int num_heads, const char* op) {
  KILN_CHECK(qkv.shape.rank == 3 && qkv.shape[2] % 3 == 0, "{}: qkv must be [B, T, 3C], got {}", op,
             qkv.shape.to_string());
  const int64_t C = qkv.shape[2] / 3;
  KILN_CHECK(num_heads > 0 && C % num_heads == 0, "{}: {} heads do not divide {} channels", op,
             num_heads, C);
  return {qkv.shape[0], qkv.shape[1], C, num_heads, C / num_heads};
}

}  // namespace

void CpuBackend::attention_forward(const AttentionForward& args) {
  constexpr const char* op = "attention_forward";
  cpu::require(args.out, DType::F32, op, "out");
  cpu::require(args.probs, DType::F32, op, "probs");
  cpu::require(args.qkv, DType::F32, op, "qkv");
  const auto [B, T, C, NH, HS] = attention_shape(args.qkv, args.num_heads, op);
  cpu::require_numel(args.out, B * T * C, op, "out");
  cpu::require_numel(args.probs, B * NH * T * T, op, "probs");
  const bool causal = args.mask != AttentionMask::KeyPadding;
  const bool padded = args.mask != AttentionMask::Causal;
  const int32_t* key_mask = nullptr;
  if (padded) {
    cpu::require(args.key_mask, DType::I32, op, "key_mask");
    cpu::require_numel(args.key_mask, B * T, op, "key_mask");
    key_mask = args.key_mask.as<int32_t>();
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  float* out = args.out.as<float>();
  float* probs = args.probs.as<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * 3 * C + h * HS;
        float* row = probs + ((b * NH + h) * T + t) * T;
        const int64_t last_key = causal ? t : T - 1;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t t2 = 0; t2 < T; ++t2) {
          const bool visible = t2 <= last_key && (!padded || key_mask[b * T + t2] != 0);
          if (!visible) {
            row[t2] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* k = qkv + (b * T + t2) * 3 * C + C + h * HS;
          float dot = 0.0f;
          for (int64_t d = 0; d < HS; ++d) dot += q[d] * k[d];
          row[t2] = dot * scale;
          max_score = std::max(max_score, row[t2]);
        }
        float* out_row = out + (b * T + t) * C + h * HS;
        for (int64_t d = 0; d < HS; ++d) out_row[d] = 0.0f;
        if (max_score == -std::numeric_limits<float>::infinity()) {  // no visible key
          for (int64_t t2 = 0; t2 < T; ++t2) row[t2] = 0.0f;
          continue;
        }
        float sum = 0.0f;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          row[t2] = std::exp(row[t2] - max_score);  // exp(-inf) = 0 for masked keys
          sum += row[t2];
        }
        const float inverse_sum = 1.0f / sum;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          row[t2] *= inverse_sum;
          if (row[t2] == 0.0f) continue;
          const float* v = qkv + (b * T + t2) * 3 * C + 2 * C + h * HS;
          for (int64_t d = 0; d < HS; ++d) out_row[d] += row[t2] * v[d];
        }
      }
    }
  }
}

void CpuBackend::attention_backward(const AttentionBackward& args) {
  constexpr const char* op = "attention_backward";
  cpu::require(args.dqkv, DType::F32, op, "dqkv");
  cpu::require(args.dprobs, DType::F32, op, "dprobs");
  cpu::require(args.dout, DType::F32, op, "dout");
  cpu::require(args.qkv, DType::F32, op, "qkv");
  cpu::require(args.probs, DType::F32, op, "probs");
  const auto [B, T, C, NH, HS] = attention_shape(args.qkv, args.num_heads, op);
  cpu::require_numel(args.dqkv, B * T * 3 * C, op, "dqkv");
  cpu::require_numel(args.dprobs, B * NH * T * T, op, "dprobs");
  cpu::require_numel(args.probs, B * NH * T * T, op, "probs");
  cpu::require_numel(args.dout, B * T * C, op, "dout");
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  const float* dout = args.dout.as<float>();
  const float* probs = args.probs.as<float>();
  float* dqkv = args.dqkv.as<float>();
  float* dprobs = args.dprobs.as<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t part = 0; part < 3; ++part)
          for (int64_t d = 0; d < HS; ++d) dqkv[(b * T + t) * 3 * C + part * C + h * HS + d] = 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const float* p_row = probs + ((b * NH + h) * T + t) * T;
        float* dp_row = dprobs + ((b * NH + h) * T + t) * T;
        const float* grad = dout + (b * T + t) * C + h * HS;
        float weighted = 0.0f;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          dp_row[t2] = 0.0f;
          if (p_row[t2] == 0.0f) continue;
          const float* v = qkv + (b * T + t2) * 3 * C + 2 * C + h * HS;
          float dot = 0.0f;
          for (int64_t d = 0; d < HS; ++d) dot += grad[d] * v[d];
          dp_row[t2] = dot;
          weighted += p_row[t2] * dot;
        }
        const float* q = qkv + (b * T + t) * 3 * C + h * HS;
        float* dq = dqkv + (b * T + t) * 3 * C + h * HS;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          const float p = p_row[t2];
          if (p == 0.0f) continue;
          const float dscore = p * (dp_row[t2] - weighted) * scale;
          const float* k = qkv + (b * T + t2) * 3 * C + C + h * HS;
          float* dk = dqkv + (b * T + t2) * 3 * C + C + h * HS;
          float* dv = dqkv + (b * T + t2) * 3 * C + 2 * C + h * HS;
          for (int64_t d = 0; d < HS; ++d) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
            dv[d] += p * grad[d];
          }
        }
      }
    }
  }
}

}  // namespace kiln
