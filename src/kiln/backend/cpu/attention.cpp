// Multi-head self-attention core under the flash-attention contract (ops.h), written in its
// matrix form per (batch, head):
//   forward:  S = q k^T / sqrt(HS), masked;  lse = logsumexp(S) per query;  out = softmax(S) v
//   backward: P = exp(S - lse) (S recomputed);  dP = dO v^T;  D = rowsum(dO * out);
//             dS = P * (dP - D) / sqrt(HS);  dq = dS k;  dk = dS^T q;  dv = P^T dO.
// With attention dropout (ops.h) the probabilities are multiplied by the mask's factors Z before
// P v, and the backward takes dP Z and (P Z)^T dO.
// Only lse outlives a call; the T x T matrices live in per-thread scratch that grows to the
// largest T seen (one allocation per thread, then none). Products run through BLAS
// (single-threaded inside the per-head OpenMP loop). Each (batch, head) pair is owned by one
// thread and writes only its own slices, so there are no races.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/column_sums.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/fp8_cast.h"
#include "kiln/backend/cpu/vector_math.h"

namespace kiln {
namespace {

constexpr float kNoKey = -std::numeric_limits<float>::infinity();

// This thread's T x T buffers: scores/probabilities and their gradient.
struct HeadScratch {
  float* scores;
  float* grads;
};
HeadScratch head_scratch(int64_t T) {
  thread_local std::vector<float> scores, grads;
  const auto size = static_cast<size_t>(T * T);
  if (scores.size() < size) {
    scores.resize(size);
    grads.resize(size);
  }
  return {scores.data(), grads.data()};
}

// Which keys query t sees.
struct Visibility {
  bool causal;
  const int32_t* key_mask;  // this sequence's [T] mask, or null
  bool operator()(int64_t t, int64_t key) const {
    return (!causal || key <= t) && (key_mask == nullptr || key_mask[key] != 0);
  }
};

Visibility visibility(const Tensor& key_mask, AttentionMask mask, int64_t b, int64_t T) {
  const bool padded = mask != AttentionMask::Causal;
  return {mask != AttentionMask::KeyPadding, padded ? key_mask.as<int32_t>() + b * T : nullptr};
}

// row[key] = e^(row[key] - shift) for the keys query t sees, 0 for the others.
void exp_visible(float* row, int64_t t, int64_t T, const Visibility& visible, float shift) {
  const int64_t seen = visible.causal ? t + 1 : T;  // keys past it are hidden
  exp_shifted_in_place(row, seen, shift);
  std::fill(row + seen, row + T, 0.0f);
  if (visible.key_mask != nullptr)
    for (int64_t key = 0; key < seen; ++key)
      if (visible.key_mask[key] == 0) row[key] = 0.0f;
}

// Soft-maxes one row of scores in place and returns its log-sum-exp; a row with no visible key
// becomes zeros and returns -inf.
float softmax_row(float* row, int64_t t, int64_t T, const Visibility& visible) {
  float max_score = kNoKey;
  for (int64_t key = 0; key < T; ++key)
    if (visible(t, key)) max_score = std::max(max_score, row[key]);
  if (max_score == kNoKey) {
    std::fill(row, row + T, 0.0f);
    return kNoKey;
  }
  exp_visible(row, t, T, visible, max_score);
  float sum = 0.0f;
  for (int64_t key = 0; key < T; ++key) sum += row[key];
  const float inverse_sum = 1.0f / sum;
  for (int64_t key = 0; key < T; ++key) row[key] *= inverse_sum;
  return max_score + std::log(sum);
}

// Multiplies row t of head (b, h)'s probabilities [T] by the dropout mask's factors (ops.h).
void drop_probabilities(float* row, const DropoutMask& mask, int64_t b, int64_t h, int64_t t, int64_t NH, int64_t T) {
  const auto first = static_cast<uint64_t>(((b * NH + h) * T + t) * T);
  for (int64_t key = 0; key < T; ++key) row[key] *= mask.factor(first + static_cast<uint64_t>(key));
}

void attention_forward_fp32(const AttentionForward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_forward(args, Device::CPU);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  float* out = args.out.as<float>();
  float* lse = args.lse.as<float>();
  const DropoutMask mask = dropout_mask(args.dropout.probability, args.dropout.seed, args.dropout.stream);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * 3 * C + h * HS;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* p = head_scratch(T).scores;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
      const Visibility visible = visibility(args.key_mask, args.mask, b, T);
      for (int64_t t = 0; t < T; ++t) {
        lse[(b * NH + h) * T + t] = softmax_row(p + t * T, t, T, visible);
        if (args.dropout.active()) drop_probabilities(p + t * T, mask, b, h, t, NH, T);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, v, 3 * C, 0.0f,
                  out + b * T * C + h * HS, C);
    }
  }
}

void attention_backward_fp32(const AttentionBackward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_backward(args, Device::CPU);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* qkv = args.qkv.as<float>();
  const float* dout = args.dout.as<float>();
  const float* out = args.out.as<float>();
  const float* lse = args.lse.as<float>();
  float* dqkv = args.dqkv.as<float>();
  const bool dropping = args.dropout.active();
  const DropoutMask mask = dropout_mask(args.dropout.probability, args.dropout.seed, args.dropout.stream);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t offset = b * T * 3 * C + h * HS;
      const float *q = qkv + offset, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + offset, *dk = dq + C, *dv = dq + 2 * C;
      const float* d_o = dout + b * T * C + h * HS;
      const float* o = out + b * T * C + h * HS;
      const float* row_lse = lse + (b * NH + h) * T;
      const HeadScratch scratch = head_scratch(T);
      float *p = scratch.scores, *ds = scratch.grads;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
      const Visibility visible = visibility(args.key_mask, args.mask, b, T);
      for (int64_t t = 0; t < T; ++t) {  // P = exp(S - lse); -inf lse (no visible key) gives zeros
        if (row_lse[t] == kNoKey)
          std::fill(p + t * T, p + (t + 1) * T, 0.0f);
        else
          exp_visible(p + t * T, t, T, visible, row_lse[t]);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, d_o, C, v, 3 * C, 0.0f, ds, T);
      for (int64_t t = 0; t < T; ++t) {  // dP -> dS in place; with dropout, P -> P Z for dv
        float row_dot = 0.0f;            // D = rowsum(dO * out)
        for (int64_t d = 0; d < HS; ++d) row_dot += d_o[t * C + d] * o[t * C + d];
        const auto first = static_cast<uint64_t>(((b * NH + h) * T + t) * T);
        for (int64_t key = 0; key < T; ++key) {
          const float z = dropping ? mask.factor(first + static_cast<uint64_t>(key)) : 1.0f;
          ds[t * T + key] = p[t * T + key] * (ds[t * T + key] * z - row_dot) * scale;
          p[t * T + key] *= z;
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, k, 3 * C, 0.0f, dq, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, ds, T, q, 3 * C, 0.0f, dk, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, p, T, d_o, C, 0.0f, dv, 3 * C);
    }
  }
}

}  // namespace

// With fp8 the output is then cast too, from the values write_back() rounds (ops.h).
void CpuBackend::attention_forward(const AttentionForward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_forward(args, Device::CPU);
  Fp32Scope f(scratch_);
  const Tensor out = f.output(args.out);
  attention_forward_fp32(
      {out, args.lse, f.input(args.qkv), args.key_mask, args.num_heads, args.mask, nullptr, {}, {}, args.dropout});
  if (args.fp8)
    cast_output_to_fp8(out.reshaped({B * T, C}), args.qkv.dtype, *args.fp8, DType::F8E4M3, args.out_fp8,
                       args.out_fp8_t, scratch_);
  f.write_back();
}

// With fp8, dqkv is then cast as c_attn's backward would cast it, and that backward's bias gradient
// taken from the rounded values, as the backward would take it (ops.h).
void CpuBackend::attention_backward(const AttentionBackward& args) {
  const auto [B, T, C, NH, HS] = checks::attention_backward(args, Device::CPU);
  zero_to_write(args.param_store, {args.dbias});
  Fp32Scope f(scratch_);  // with fp8 the gradient goes to scratch, to be cast
  const Tensor dqkv = args.fp8 ? Tensor{scratch_.take(static_cast<size_t>(B * T * 3 * C)), Shape{B, T, 3 * C}}
                               : f.output(args.dqkv);
  attention_backward_fp32({dqkv, f.input(args.dout), f.input(args.qkv), f.input(args.out), args.lse, args.key_mask,
                           args.num_heads, args.mask, nullptr, {}, {}, {}, GradStore::Add, args.dropout});
  if (args.fp8) {
    const Tensor rows = dqkv.reshaped({B * T, 3 * C});
    cast_output_to_fp8(rows, args.qkv.dtype, args.fp8->dout, args.fp8->grad_dtype, args.dqkv_fp8, args.dqkv_fp8_t,
                       scratch_);
    if (!args.dbias.empty()) add_column_sums(args.dbias.as<float>(), rows.as<float>(), B * T, 3 * C);
  }
  f.write_back();
}

}  // namespace kiln
