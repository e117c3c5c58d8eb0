#include "kiln/backend/op_work.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "kiln/core/error.h"
#include "kiln/perf/flops.h"

namespace kiln {
namespace {

int64_t last_dim(const Tensor& tensor) {
  return tensor.shape.rank ? tensor.shape[tensor.shape.rank - 1] : 0;
}

// "M x K x N" of a product.
std::string product_shape(int64_t M, int64_t K, int64_t N) { return fmt::format("{}x{}x{}", M, K, N); }

// "B x T, NH heads of HS" from qkv [B, T, 3C].
std::string attention_shape(const Tensor& qkv, int num_heads) {
  if (qkv.shape.rank != 3 || num_heads <= 0) return qkv.shape.to_string();
  return fmt::format("{}x{}, {} heads of {}", qkv.shape[0], qkv.shape[1], num_heads,
                     qkv.shape[2] / 3 / num_heads);
}

// Bytes of the tensors given, empty ones counting nothing.
double bytes_of(std::initializer_list<const Tensor*> tensors) {
  double total = 0.0;
  for (const Tensor* tensor : tensors)
    if (!tensor->empty()) total += static_cast<double>(tensor->bytes());
  return total;
}

// Bytes of gradients stored as `store` says: read and written to add, written only to write.
double gradient_bytes(GradStore store, std::initializer_list<const Tensor*> grads) {
  return (store == GradStore::Write ? 1 : 2) * bytes_of(grads);
}

double product_flops(int64_t M, int64_t K, int64_t N) { return 2.0 * static_cast<double>(M) * K * N; }

// perf/flops.h's count for qkv [B, T, 3C].
double attention_flops(const Tensor& qkv, AttentionMask mask) {
  if (qkv.shape.rank != 3) return 0.0;
  return attention_forward_flops(qkv.shape[0], qkv.shape[1], qkv.shape[2] / 3,
                                 mask != AttentionMask::KeyPadding);
}

// An fp8 product writes each fp8 copy once (the cast) and reads it once (the product), one byte an
// element: forward `in` [M,K] and the weight; backward dout transposed and `in` transposed for the
// weight gradient, and dout and the weight again for the input gradient (fp8_workspace.h). With
// `in`'s codes kept (ops.h, in_fp8_t), the forward also writes them, transposed, and the backward
// only reads them. A forward given `in` as codes (ops.h) casts only the weight; the codes' read is
// `in`'s own bytes.
// A backward given dout as codes (ops.h) casts no dout; the codes' reads are dout's and dout_fp8_t's
// own bytes. A product given the weight's codes (ops.h, weight_fp8) casts no weight; their read is
// weight_fp8's own bytes.
double fp8_copies_bytes(int64_t M, int64_t K, int64_t N, bool forward, bool input_gradient, bool codes_kept,
                        bool in_cast = true, bool dout_cast = true, bool weight_cast = true) {
  const double in = static_cast<double>(M * K), weight = weight_cast ? static_cast<double>(K * N) : 0.0,
               out = dout_cast ? static_cast<double>(M * N) : 0.0;
  if (forward) return 2.0 * ((in_cast ? in : 0.0) + weight) + (codes_kept ? in : 0.0);
  return 2.0 * out + (codes_kept ? in : 2.0 * in) + (input_gradient ? 2.0 * (out + weight) : 0.0);
}

// The bytes of those casts' passes (OpWork::pass_bytes): each reads its 16-bit operand and writes
// the codes (the product's reads of them are not part of the pass).
// `weight`: the 16-bit weight the product casts, or empty where it is given as codes.
double fp8_cast_passes_bytes(const Tensor& in, const Tensor& weight, const Tensor& dout, int64_t M, int64_t K,
                             int64_t N, bool forward, bool input_gradient, bool codes_kept, bool in_cast = true,
                             bool dout_cast = true) {
  const double in_codes = static_cast<double>(M * K),
               weight_codes = weight.empty() ? 0.0 : static_cast<double>(K * N),
               out_codes = dout_cast ? static_cast<double>(M * N) : 0.0;
  if (forward)
    return (in_cast ? bytes_of({&in}) + in_codes * (codes_kept ? 2.0 : 1.0) : 0.0) + bytes_of({&weight}) +
           weight_codes;
  return (dout_cast ? bytes_of({&dout}) : 0.0) + out_codes * (input_gradient ? 2.0 : 1.0) +
         (input_gradient ? bytes_of({&weight}) + weight_codes : 0.0) +
         (codes_kept ? 0.0 : bytes_of({&in}) + in_codes);
}

}  // namespace

// Traffic: out written, the same amount of wte and wpe rows gathered, tokens read.
OpWork work_of(const EmbeddingForward& a) {
  return {"embedding_forward", 0.0, 3 * bytes_of({&a.out}) + bytes_of({&a.tokens})};
}
// Traffic: dout and tokens read; per position one wte gradient row (fp32) read and written; dwpe's
// used rows read and written, or with Write all its rows written.
OpWork work_of(const EmbeddingBackward& a) {
  const double rows =
      a.dout.shape.rank == 3 ? static_cast<double>(a.dout.shape[0] * a.dout.shape[1]) : 0.0;
  const double row_bytes =
      a.dwte.shape.rank == 2 ? static_cast<double>(a.dwte.shape[1]) * sizeof(float) : 0.0;
  const double positions = a.dout.shape.rank == 3 ? static_cast<double>(a.dout.shape[1]) : 0.0;
  const double dwpe_bytes =
      a.dwpe_store == GradStore::Write ? bytes_of({&a.dwpe}) : 2 * positions * row_bytes;
  return {"embedding_backward", 0.0, bytes_of({&a.dout, &a.tokens}) + 2 * rows * row_bytes + dwpe_bytes};
}

// With fp8 the output's codes are written in its place (ops.h); the row says so.
OpWork work_of(const LayerNormForward& a) {
  return {a.fp8 ? "layernorm_forward fp8" : "layernorm_forward", 0.0,
          bytes_of({&a.out, &a.mean, &a.rstd, &a.in, &a.weight, &a.bias, &a.out_fp8, &a.out_fp8_t})};
}
// With fp8 din's codes are written too, in both layouts, with the next product's bias gradient
// (ops.h); the row says "fp8".
OpWork work_of(const LayerNormBackward& a) {
  return {a.fp8 ? "layernorm_backward fp8" : "layernorm_backward", 0.0,
          gradient_bytes(a.din_store, {&a.din}) +
              gradient_bytes(a.param_store, {&a.dweight, &a.dbias, &a.product_dbias}) +
              bytes_of({&a.dout, &a.in, &a.weight, &a.mean, &a.rstd, &a.din_fp8, &a.din_fp8_t})};
}
// With gelu_fp8 the GELU output's codes are written in its place, in one layout or both, by a cast
// that reads `out` again (ops.h); the row says "+gelu codes".
OpWork work_of(const MatmulForward& a) {
  const int64_t N = last_dim(a.out), K = last_dim(a.in), M = K ? a.in.numel() / K : 0;
  const bool fp8 = a.fp8 != nullptr;
  const char* gelu = a.gelu_fp8 ? " +gelu codes" : a.gelu_out.empty() ? "" : " +gelu";
  const bool in_cast = a.in.dtype != DType::F8E4M3, codes_kept = !a.in_fp8_t.empty();
  const bool weight_cast = a.weight_fp8.empty();
  const Tensor& weight_read = weight_cast ? a.weight : a.weight_fp8;
  const Tensor weight_to_cast = weight_cast ? a.weight : Tensor{};
  OpWork work{"matmul_forward " + product_shape(M, K, N) + (a.bias.empty() ? "" : " +bias") + gelu +
                  (a.residual.empty() ? "" : " +residual") + (fp8 ? " fp8" : "") +
                  (weight_cast ? "" : " weight codes"),
              product_flops(M, K, N),
              bytes_of({&a.out, &a.in, &weight_read, &a.bias, &a.gelu_out, &a.gelu_out_t, &a.residual}) +
                  (a.gelu_fp8 ? bytes_of({&a.out}) : 0.0) +
                  (fp8 ? fp8_copies_bytes(M, K, N, /*forward=*/true, false, codes_kept, in_cast, true, weight_cast)
                       : 0.0),
              fp8};
  work.pass_bytes =
      (fp8 ? fp8_cast_passes_bytes(a.in, weight_to_cast, Tensor{}, M, K, N, /*forward=*/true, false, codes_kept,
                                   in_cast)
           : 0.0) +
      (a.gelu_fp8 ? bytes_of({&a.out, &a.gelu_out, &a.gelu_out_t}) : 0.0);
  return work;
}
// The weight gradient always (one product), the input gradient when asked for (another). With
// `in`'s codes kept, `in` is not read. With dout as codes (ops.h) the row says "dout codes": the
// weight gradient reads their transpose, the input gradient the codes themselves. With din cast
// for its reader (ops.h, din_reader) the row says "din codes": the product writes the 16-bit din
// to scratch and a pass reads it and writes its codes in both layouts (GELU's derivative taken in
// the product's epilogue, as the bf16 products take it).
OpWork work_of(const MatmulBackward& a) {
  const bool codes_kept = !a.in_fp8_t.empty(), dout_cast = a.dout_fp8_t.empty();
  const int64_t N = last_dim(a.dout);
  const int64_t K = codes_kept ? a.in_fp8_t.shape[0] : last_dim(a.in);
  const int64_t M = codes_kept ? a.in_fp8_t.shape[1] : (K ? a.in.numel() / K : 0);
  const bool fp8 = a.fp8 != nullptr, din_cast = a.din_reader != nullptr;
  const bool input_gradient = !a.din.empty() || din_cast;
  const double din_scratch = din_cast ? 2.0 * static_cast<double>(M * K) : 0.0;  // 16-bit din, written then read
  const Tensor in_read = codes_kept ? Tensor{} : a.in;
  const Tensor dout_read = dout_cast || input_gradient ? a.dout : Tensor{};
  const bool weight_cast = a.weight_fp8.empty();
  const Tensor& weight_read = weight_cast ? a.weight : a.weight_fp8;
  const Tensor weight_to_cast = weight_cast ? a.weight : Tensor{};
  OpWork work{"matmul_backward " + product_shape(M, K, N) + (a.dbias.empty() ? "" : " +dbias") +
                  (a.gelu_in.empty() ? "" : " +dgelu") + (fp8 ? " fp8" : "") + (dout_cast ? "" : " dout codes") +
                  (weight_cast ? "" : " weight codes") + (din_cast ? " din codes" : ""),
              product_flops(M, K, N) * (input_gradient ? 2.0 : 1.0),
              gradient_bytes(a.param_store, {&a.dweight, &a.dbias, &a.reader_dbias}) + 2.0 * din_scratch +
                  bytes_of({&a.din, &dout_read, &a.dout_fp8_t, &in_read, &weight_read, &a.gelu_in, &a.din_fp8,
                            &a.din_fp8_t}) +
                  (fp8 ? fp8_copies_bytes(M, K, N, /*forward=*/false, input_gradient, codes_kept, true, dout_cast,
                                          weight_cast)
                       : 0.0),
              fp8};
  if (fp8)
    work.pass_bytes = fp8_cast_passes_bytes(in_read, weight_to_cast, a.dout, M, K, N, /*forward=*/false,
                                            input_gradient, codes_kept, true, dout_cast) +
                      (din_cast ? din_scratch + bytes_of({&a.din_fp8, &a.din_fp8_t}) : 0.0);
  return work;
}
// With fp8 the output's codes are written in its place (ops.h); the row says so.
OpWork work_of(const GeluForward& a) {
  return {a.fp8 ? "gelu_forward fp8" : "gelu_forward", 0.0, bytes_of({&a.out, &a.in, &a.out_fp8_t})};
}
OpWork work_of(const GeluBackward& a) {
  return {"gelu_backward", 0.0, bytes_of({&a.din, &a.in, &a.dout})};
}
OpWork work_of(const TanhForward& a) { return {"tanh_forward", 0.0, bytes_of({&a.out, &a.in})}; }
OpWork work_of(const TanhBackward& a) { return {"tanh_backward", 0.0, bytes_of({&a.din, &a.out, &a.dout})}; }
// Only the gathered rows of `in` are read, as big as `out`.
OpWork work_of(const GatherRows& a) { return {"gather_rows", 0.0, 2 * bytes_of({&a.out})}; }
// Write stores all of din (the other rows zeroed); Add reads and writes only the position's rows.
OpWork work_of(const GatherRowsBackward& a) {
  const double rows = bytes_of({&a.dout});
  return {"gather_rows_backward", 0.0, rows + (a.store == GradStore::Write ? bytes_of({&a.din}) : 2 * rows)};
}
// Counted as if every row were kept: all of `in` read, all of `out` written, and the mask.
OpWork work_of(const MaskRows& a) { return {"mask_rows", 0.0, bytes_of({&a.out, &a.in, &a.keep})}; }
// With fp8 the output's codes are written too (ops.h); the row says so.
OpWork work_of(const AttentionForward& a) {
  return {"attention_forward " + attention_shape(a.qkv, a.num_heads) + (a.fp8 ? " fp8" : ""),
          attention_flops(a.qkv, a.mask), bytes_of({&a.out, &a.lse, &a.qkv, &a.key_mask, &a.out_fp8, &a.out_fp8_t})};
}
// With fp8 the gradient's codes, in both layouts, are written in dqkv's place (ops.h), with the bias
// gradient; the row says "+dbias fp8" or "fp8".
OpWork work_of(const AttentionBackward& a) {
  const bool fp8 = a.fp8 != nullptr;
  const Tensor written = fp8 ? Tensor{} : a.dqkv;
  return {"attention_backward " + attention_shape(a.qkv, a.num_heads) + (a.dbias.empty() ? "" : " +dbias") +
              (fp8 ? " fp8" : ""),
          kAttentionBackwardFlopsFactor * attention_flops(a.qkv, a.mask),
          bytes_of({&written, &a.dqkv_fp8, &a.dqkv_fp8_t, &a.dout, &a.qkv, &a.out, &a.lse, &a.key_mask}) +
              gradient_bytes(a.param_store, {&a.dbias})};
}
// The logits read, and written again when the gradient replaces them; with fp8 the gradient's codes
// are written in both layouts instead (ops.h), and the row says "fp8".
OpWork work_of(const SoftmaxCrossEntropy& a) {
  const bool in_place = a.write_grad && !a.fp8;
  return {a.fp8 ? "softmax_cross_entropy fp8" : "softmax_cross_entropy", 0.0,
          (in_place ? 2.0 : 1.0) * bytes_of({&a.logits}) +
              bytes_of({&a.losses, &a.targets, &a.grad_fp8, &a.grad_fp8_t})};
}
// master and both moments read and written, the gradient read, the parameters written.
OpWork work_of(const AdamwStep& a) {
  const bool separate = !a.param_out.empty() && a.param_out.data != a.master.data;
  return {"adamw_step", 0.0,
          2 * bytes_of({&a.master, &a.exp_avg, &a.exp_avg_sq}) + bytes_of({&a.grad}) +
              (separate ? bytes_of({&a.param_out}) : 0.0)};
}
OpWork work_of(const SumOfSquares& a) { return {"sum_of_squares", 0.0, bytes_of({&a.in})}; }
OpWork work_of(const Fp8UpdateScales& a) {
  return {"fp8_update_scales", 0.0, 2 * bytes_of({&a.state})};
}
OpWork work_of(const Dropout& a) { return {"dropout", 0.0, bytes_of({&a.out, &a.in, &a.residual})}; }
OpWork work_of(const Fill& a) { return {"fill", 0.0, bytes_of({&a.out})}; }
// To fp8 codes (ops.h) the row says "fp8": one pass reading `in` and writing the codes, in one
// layout or both.
OpWork work_of(const Convert& a) {
  return {a.fp8 ? "convert fp8" : "convert", 0.0, bytes_of({&a.out, &a.in, &a.out_t})};
}

void OpLedger::add(const OpWork& work, double ms, const std::vector<LaunchTime>& launches) {
  OpTotals call{work.op, 1, work.flops, work.bytes, work.fp8, work.host_copy, ms, work.pass_bytes, {}};
  for (const LaunchTime& launch : launches) call.launches.push_back({launch.what, 1, launch.ms});
  add(call);
}

void OpLedger::add(const OpTotals& totals) {
  OpTotals& entry = entries_[totals.op];
  entry.op = totals.op;
  entry.calls += totals.calls;
  entry.flops += totals.flops;
  entry.bytes += totals.bytes;
  entry.pass_bytes += totals.pass_bytes;
  entry.fp8 = totals.fp8;
  entry.host_copy = totals.host_copy;
  entry.total_ms += totals.total_ms;
  for (const LaunchTotals& launch : totals.launches) {
    auto same = std::find_if(entry.launches.begin(), entry.launches.end(),
                             [&](const LaunchTotals& known) { return known.what == launch.what; });
    if (same == entry.launches.end()) same = entry.launches.insert(entry.launches.end(), {launch.what, 0, 0.0});
    same->launches += launch.launches;
    same->total_ms += launch.total_ms;
  }
}

std::vector<OpTotals> OpLedger::totals() const {
  std::vector<OpTotals> result;
  for (const auto& [op, totals] : entries_) result.push_back(totals);
  std::stable_sort(result.begin(), result.end(),
                   [](const OpTotals& a, const OpTotals& b) { return a.total_ms > b.total_ms; });
  for (OpTotals& totals : result)
    std::stable_sort(totals.launches.begin(), totals.launches.end(),
                     [](const LaunchTotals& a, const LaunchTotals& b) { return a.total_ms > b.total_ms; });
  return result;
}

namespace {

// The op's arithmetic and the bytes it overlaps, and its passes' bytes (OpWork::pass_bytes).
struct Bounds {
  double compute_s = 0.0, memory_s = 0.0, passes_s = 0.0;
};

Bounds bounds(const OpTotals& totals, const DeviceLimits& limits) {
  KILN_CHECK(!totals.host_copy, "'{}' crosses the host link: no device roofline applies",
             totals.op);
  const double rate = totals.fp8 ? limits.fp8_tflops : limits.tflops;
  KILN_CHECK(totals.flops == 0.0 || rate > 0.0, "no {}TFLOP/s limit for '{}'",
             totals.fp8 ? "fp8 " : "", totals.op);
  KILN_CHECK(totals.bytes == 0.0 || limits.bandwidth_gb_per_s > 0.0, "no memory bandwidth for '{}'",
             totals.op);
  const auto seconds = [&](double bytes) { return bytes > 0.0 ? bytes / (limits.bandwidth_gb_per_s * 1e9) : 0.0; };
  return {totals.flops > 0.0 ? totals.flops / (rate * 1e12) : 0.0, seconds(totals.bytes - totals.pass_bytes),
          seconds(totals.pass_bytes)};
}

}  // namespace

double roofline_ms(const OpTotals& totals, const DeviceLimits& limits) {
  const Bounds b = bounds(totals, limits);
  return 1e3 * (std::max(b.compute_s, b.memory_s) + b.passes_s);
}

bool compute_bound(const OpTotals& totals, const DeviceLimits& limits) {
  const Bounds b = bounds(totals, limits);
  return totals.flops > 0.0 && b.compute_s >= b.memory_s;
}

}  // namespace kiln
