// The op table: one typed argument struct per op. Every back-end implements every op in the
// Backend interface (backend.h) from these structs; the CPU back-end is the reference.
//
// Shape names: B batch, T sequence, C channels, NH heads, HS = C / NH head size, V vocabulary,
// Vp padded vocabulary (row stride of logits and of the token embedding), M rows = B * T.
//
// Gradient conventions (so neither gradient accumulation nor the first micro-batch of a step
// needs a pass of its own):
//   - parameter gradients (dweight, dbias, dwte, dwpe) are ADDED to (+=), or WRITTEN (=) where the
//     op's GradStore (below) says Write;
//   - activation gradients are WRITTEN (=), except where an op says it adds: layernorm's input
//     gradient is added because its input is always the residual stream, which has two readers
//     (the first of them, ln_f's backward, writes it: LayerNormBackward::din_store).
//
// Dtypes (the precision policy of mixed-precision training, as Megatron-LM's bf16/fp16 modes):
// every op has one compute dtype, fp32, bf16 or fp16, that its activations, activation gradients
// and weights share (the model keeps its parameters in that dtype). Parameter gradients (dweight,
// dbias, dwte, dwpe), LayerNorm statistics (mean, rstd) and per-token losses are always fp32, so
// gradients accumulate across micro-batches in fp32. Arithmetic inside an op is fp32 whatever the
// storage; each output is rounded to its dtype once. The reference meaning of a bf16/fp16 op is
// therefore: widen the inputs exactly, run the fp32 op, round the outputs (cpu/fp32_scope.h).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/backend/dropout_mask.h"
#include "kiln/core/tensor.h"
#include "kiln/core/uncounted_target.h"

namespace kiln {

// How an op stores a gradient that accumulates: Add (+=; later micro-batches of a step, and every
// contribution after the first to a tensor with several, like the tied wte) or Write (=; a
// step's first contribution, so no pass zeroes the gradients before it). Write never reads what
// the tensor held: NaN there is overwritten. Either way the stored value is bit for bit what Add
// into zeros would leave (up to the sign of a zero).
enum class GradStore : uint8_t { Add, Write };

// ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] ----------------------------------
struct EmbeddingForward {
  Tensor out;     // [B, T, C]
  Tensor tokens;  // [B, T] int32, each in [0, rows of wte)
  Tensor wte;     // [Vp, C]
  Tensor wpe;     // [maxT, C], maxT >= T
};
struct EmbeddingBackward {
  Tensor dwte;    // [Vp, C] +=, always: only the rows of tokens present have a contribution
  Tensor dwpe;    // [maxT, C] += or = (dwpe_store); Write writes all maxT rows, zero past T
  Tensor dout;    // [B, T, C]
  Tensor tokens;  // [B, T] int32
  GradStore dwpe_store = GradStore::Add;
};

// ---- layernorm over the last axis: out = (in - mean) * rstd * weight + bias -------------------
// Cast for an fp8 product (bf16/fp16, M and C multiples of 16; the fp8 products below): with
// `fp8` given (the product's Fp8Matmul::in), the op casts its output as that product's forward
// would: the E4M3 codes of out rounded to the compute dtype, fp8(out * scale), into out_fp8 [M, C]
// and, transposed, out_fp8_t [C, M] (the product's in_fp8_t for its backward; or empty, where no
// backward will read them), and max |out| max-accumulated into fp8->amax. `out` is then empty, not written: the product reads the codes
// (MatmulForward with `in` as codes). One pass where the norm and the cast took two.
struct Fp8Operand;
struct Fp8Matmul;
struct LayerNormForward {
  Tensor out;     // [M, C]; empty with fp8
  Tensor mean;    // [M] saved for backward
  Tensor rstd;    // [M] saved for backward: 1 / sqrt(var + eps)
  Tensor in;      // [M, C]
  Tensor weight;  // [C]
  Tensor bias;    // [C]
  float eps = 1e-5f;
  const Fp8Operand* fp8 = nullptr;     // cast the output (above), or null
  Tensor out_fp8 = {}, out_fp8_t = {};  // with fp8: [M, C] and [C, M] (or empty) E4M3 codes
};
// Input gradient cast for the next fp8 product (the backward of the product that reads din next
// as its output gradient: the attention's c_proj after ln_2, the previous block's MLP c_proj after
// ln_1 and ln_f): with `fp8` given (that product's Fp8Matmul; bf16 or fp16, M and C multiples of
// 16), din is stored as without it (the next LayerNorm adds to it) and also cast as that backward
// would cast its output gradient: din as stored (after the add), its codes fp8(din * fp8->dout.scale)
// in fp8->grad_dtype into din_fp8 ([M, C]) and, transposed, din_fp8_t ([C, M]), max |din| max-
// accumulated into fp8->dout.amax, and that backward's bias gradient, the column sums of din, into
// product_dbias (+= or =, param_store; or empty). The backward then reads the codes
// (MatmulBackward, dout cast already). One pass where the LayerNorm and the cast took two.
struct LayerNormBackward {
  Tensor din;      // [M, C] += (see header), or = with din_store Write
  Tensor dweight;  // [C] += or = (param_store)
  Tensor dbias;    // [C] += or = (param_store)
  Tensor dout;     // [M, C]
  Tensor in, weight, mean, rstd;
  GradStore param_store = GradStore::Add;
  GradStore din_store = GradStore::Add;
  const Fp8Matmul* fp8 = nullptr;         // cast din for this product's backward (above), or null
  Tensor din_fp8 = {}, din_fp8_t = {};    // with fp8: [M, C] and [C, M] codes in fp8->grad_dtype
  Tensor product_dbias = {};              // with fp8: [C] fp32, += or = (param_store), or empty
};

// ---- matmul with optional bias ---------------------------------------------------------------
// InOut: weight is [K, N] (Hugging Face Conv1D layout), out = in @ weight + bias.
// OutIn: weight is [N, K] (nn.Linear layout, and the tied classifier: rows of wte), out = in @ weight^T.
enum class WeightLayout : uint8_t { InOut, OutIn };

//
// The residual add of a pre-LN block (x + proj(h)) inside the projection: with `residual` given,
// out = in W + bias + residual, summed in fp32 and rounded once (cuBLASLt's beta C with C apart
// from D). Not with gelu_out. The backward is the plain product's: the add passes dout through.
//
// GELU fusions (the MLP: gelu(x W1 + b1) W2 + b2), so a back-end can apply GELU and its derivative
// inside the products (cuBLASLt epilogues) instead of in passes of their own:
//   - forward with gelu_out: out keeps the pre-activation (for backward) and gelu_out = gelu(out);
//     a back-end may apply GELU before rounding out to the compute dtype;
//   - backward with gelu_in: `in` is gelu(gelu_in), and din receives the gradient of gelu_in,
//     (dout @ W^T) * gelu'(gelu_in), instead of the gradient of `in`.
//
// fp8 products (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; the delayed scaling of
// NVIDIA's Transformer Engine): with `fp8` given (bf16 or fp16 compute only; M, K and N multiples
// of 16, as cuBLASLt's fp8 kernels ask), the products read
// their operands cast to 8 bits, x -> fp8(x * scale) (core/fp8_codec.h: nearest even, saturating),
// and take the scales back out, * scale_inv, after the product. Forward casts `in` and `weight` to
// E4M3; backward casts `dout` to grad_dtype (E5M2, the "hybrid" format: gradients need range more
// than precision, or E4M3) and `in` and `weight` to E4M3 as forward did. Every op max-accumulates
// max |x| (before scaling) of each tensor it casts into that tensor's amax (fp8_update_scales
// turns the history of those into the next scales). The bias, the bias gradient and GELU and its
// derivative see the values before casting. Reference meaning: the op on the operands replaced
// by dec(fp8(x * scale)) * scale_inv, exactly, in fp32; gradients pass the casts straight through.
// `in`'s codes kept from forward for backward (`in_fp8_t`, fp8 only): a forward given the tensor
// also writes the E4M3 codes of `in` into it, transposed ([K, M], the weight gradient's layout), in
// the same pass as its own cast; a backward given it reads those codes instead of casting `in`
// again, and `in` may then be empty (not needed). Delayed scaling keeps `in`'s scale fixed from a
// forward to its backward, so the codes are the ones the backward would cast, and skipping the
// second cast leaves the amax unchanged (it would fold in the same maximum again).
struct Fp8Operand {
  Tensor scale;      // [1] fp32, read
  Tensor scale_inv;  // [1] fp32, read: 1 / scale; 16-byte aligned (cuBLASLt's fp8 factors: cuda/lt_matmul.h)
  Tensor amax;       // [1] fp32, max-accumulated
};
struct Fp8Matmul {
  Fp8Operand in, weight;
  Fp8Operand dout;                   // backward only
  DType grad_dtype = DType::F8E5M2;  // dout's fp8 format: F8E5M2 or F8E4M3
};

// `in` cast already (fp8 only): `in` may be the E4M3 codes [M, K] of the input, cast with fp8->in's
// scale (and its amax folded) by the op that wrote them, LayerNormForward with fp8, a
// MatmulForward with gelu_fp8 (below) or AttentionForward with fp8, which also wrote their
// transpose for the backward; the forward then casts only the weight, and in_fp8_t is empty.
//
// The weight cast already (fp8 only; a weight read by several products, the tied classifier's wte
// by every chunk's): with weight_fp8 given, the forward reads those E4M3 codes, [N, K] (K
// contiguous: the weight as stored with OutIn, transposed with InOut), instead of casting `weight`,
// which it then only takes for its shape. A Convert with fp8 (below) wrote them, with
// fp8->weight's scale, folding its amax; delayed scaling keeps that scale for the step, so the
// codes are the ones the forward would cast, and its amax the one it would fold.
//
// GELU output cast for the next fp8 product (the MLP's c_proj): with `gelu_fp8` given (that
// product's Fp8Matmul::in; bf16 or fp16 compute, M and N multiples of 16), out keeps the
// pre-activation as with gelu_out, and GELU of it (of out as rounded to the compute dtype, GELU's
// value rounded to the compute dtype again, as the GELU op gives it) is cast as that product's
// forward would cast its input: its E4M3 codes, fp8(gelu * scale), into gelu_out ([M, N] E4M3, the
// next product's `in` as codes) and, transposed, into gelu_out_t ([N, M], the next product's
// in_fp8_t for its backward), either of which may be empty (not both); max |gelu| is
// max-accumulated into gelu_fp8->amax. GELU's value is then never stored in the compute dtype. The
// product itself is fp8 or not as `fp8` says; not with `residual`.
struct MatmulForward {
  Tensor out;       // [M, N]
  Tensor in;        // [M, K] in the compute dtype, or its E4M3 codes (above)
  Tensor weight;    // [K, N] or [N, K]
  Tensor bias;      // [N] or empty
  WeightLayout layout = WeightLayout::InOut;
  Tensor gelu_out = {};  // [M, N] = gelu(out) (with gelu_fp8: its E4M3 codes), or empty
  const Fp8Matmul* fp8 = nullptr;  // fp8 products (above), or full precision
  Tensor in_fp8_t = {};  // fp8 only: [K, M] E4M3, receives `in`'s codes transposed (above), or empty
  Tensor residual = {};  // [M, N] in the compute dtype, added before rounding (above; not out), or empty
  const Fp8Operand* gelu_fp8 = nullptr;  // cast the GELU output for the next fp8 product (above), or null
  Tensor gelu_out_t = {};  // with gelu_fp8: [N, M] E4M3, the GELU output's codes transposed, or empty
  Tensor weight_fp8 = {};  // fp8 only: [N, K] E4M3 codes of the weight, cast already (above), or empty
};
// `dout` cast already (fp8 only): dout may be the codes [M, N] of the output gradient in
// fp8->grad_dtype, cast with fp8->dout's scale (and its amax folded) by the op that wrote them,
// AttentionBackward or LayerNormBackward with fp8, with their transpose in dout_fp8_t [N, M]; that
// op took the bias gradient too, so dbias is empty, and the backward casts no dout.
// The weight cast already (as MatmulForward's, above): with weight_fp8 given ([K, N] E4M3, N
// contiguous: the weight as stored with InOut, transposed with OutIn; only with din), the input
// gradient's product reads those codes instead of casting `weight`.
// Input gradient cast for the next fp8 product (the MLP's c_fc, whose output gradient is c_proj's
// input gradient with GELU's derivative applied): with `din_reader` given (that product's
// Fp8Matmul; only with this product's own `fp8`, bf16 or fp16, M and K multiples of 16, and no
// dbias of its own), din is empty, not written, and the input gradient (times gelu'(gelu_in) where
// given) as din would store it, in the compute dtype, is cast as that backward would cast its
// output gradient: its codes fp8(din * din_reader->dout.scale) in din_reader->grad_dtype into
// din_fp8 ([M, K]) and, transposed, din_fp8_t ([K, M]), max |din| max-accumulated into
// din_reader->dout.amax, and that backward's bias gradient, the column sums of din, into
// reader_dbias (+= or =, param_store; or empty). That backward then reads the codes (dout cast
// already). The CUDA back-end applies GELU's derivative in that cast, not in the product (its fp8
// DGELU epilogue measured slow on an H100): one pass where a GELU-derivative pass and a cast took
// two.
struct MatmulBackward {
  Tensor din;      // [M, K] = ; may be empty (not needed, or cast only: din_reader) unless gelu_in is given
  Tensor dweight;  // same shape as weight, += or = (param_store)
  Tensor dbias;    // [N] += or = (param_store), or empty
  Tensor dout;     // [M, N] in the compute dtype, or its codes (above)
  Tensor in;       // [M, K]; may be empty when in_fp8_t is given
  Tensor weight;
  WeightLayout layout = WeightLayout::InOut;
  Tensor gelu_in = {};  // [M, K] with in = gelu(gelu_in), or empty: din is then d gelu_in (above)
  const Fp8Matmul* fp8 = nullptr;
  Tensor in_fp8_t = {};  // fp8 only: [K, M] E4M3 codes of `in` a forward wrote (above), or empty
  GradStore param_store = GradStore::Add;
  Tensor dout_fp8_t = {};  // with dout cast already (above): [N, M] codes in fp8->grad_dtype, else empty
  Tensor weight_fp8 = {};  // fp8 only: [K, N] E4M3 codes of the weight, cast already (above), or empty
  const Fp8Matmul* din_reader = nullptr;  // cast din for this product's backward (above), or null
  Tensor din_fp8 = {}, din_fp8_t = {};    // with din_reader: [M, K] and [K, M] codes in its grad_dtype
  Tensor reader_dbias = {};               // with din_reader: [K] fp32, += or = (param_store), or empty
};

// ---- GELU, tanh approximation (Hendrycks & Gimpel 2016, as in GPT-2) --------------------------
// Cast for an fp8 product, as MatmulForward's gelu_fp8 (above): with `fp8` given (that product's
// Fp8Matmul::in; bf16 or fp16; `in` [..., N] of M rows, M and N multiples of 16), the output is
// only cast: its E4M3 codes into `out` ([M, N] E4M3) and, transposed, into out_fp8_t ([N, M]),
// either of which may be empty (not both), and max |gelu| max-accumulated into fp8->amax. Selective
// recomputation's way back to the codes a backward reads.
struct GeluForward {
  Tensor out;  // any shape (with fp8: codes, or empty)
  Tensor in;   // same shape
  const Fp8Operand* fp8 = nullptr;  // cast the output for the next fp8 product (above), or null
  Tensor out_fp8_t = {};            // with fp8: [N, M] E4M3, the output's codes transposed, or empty
};
struct GeluBackward {
  Tensor din;   // = ; may alias dout (elementwise, in place)
  Tensor in;    // the forward input
  Tensor dout;
};

// ---- tanh, elementwise (an encoder classifier's pooler: tanh(h_cls W + b)) ---------------------
// out = tanh(in). The backward reads the forward's OUTPUT, not its input: tanh' = 1 - tanh^2, so
// din = dout * (1 - out^2), and the forward's input need not be kept.
struct TanhForward {
  Tensor out;  // any shape; may alias in (elementwise, in place)
  Tensor in;   // same dtype and numel
};
struct TanhBackward {
  Tensor din;   // = ; may alias dout (elementwise, in place)
  Tensor out;   // the forward output, tanh(in)
  Tensor dout;  // same dtype and numel
};

// ---- gather one position of each sequence: out[b, :] = in[b, position, :] -------------------------
// A BERT pooler reads the first token ([CLS], position 0) of every sequence. Both tensors of each op share
// the compute dtype; 0 <= position < T. The backward scatters dout into that row of din: with
// store Write, din[b, position, :] = dout[b, :] and every other row of din is set to 0 (NaN there is
// overwritten); with Add, din[b, position, :] += dout[b, :] and the other rows are left untouched
// (GradStore's meaning, above, on an activation gradient whose other readers added already).
struct GatherRows {
  Tensor out;  // [B, C]
  Tensor in;   // [B, T, C]
  int64_t position = 0;
};
struct GatherRowsBackward {
  Tensor din;   // [B, T, C] = or += (store)
  Tensor dout;  // [B, C]
  int64_t position = 0;
  GradStore store = GradStore::Write;
};

// ---- rows masked: out[m, :] = keep[m] ? in[m, :] : 0 --------------------------------------------
// An encoder's final hidden states with its padded positions zeroed: keep is the attention mask
// (1 a real token, 0 padding), one value for each of the M = B * T rows of C channels. A kept row
// is copied as stored (no arithmetic), a dropped one set to +0 whatever it held (NaN included,
// which a product with 0 would keep). The op is its own backward, on the gradient: din = keep ?
// dout : 0. out may alias in.
struct MaskRows {
  Tensor out;   // M x C elements (any shape), = ; the compute dtype
  Tensor in;    // same dtype and numel
  Tensor keep;  // [M] int32: nonzero keeps the row
};

// ---- multi-head self-attention core: out = softmax(q k^T / sqrt(HS) + mask) v per head --------
// qkv packs [q | k | v] along the last axis, each C wide, heads contiguous inside each part
// (the layout of GPT-2's c_attn output).
// Causal masks keys after the query. KeyPadding masks keys whose key_mask is 0; with causal too,
// both apply. A query with no visible key gets a zero output, lse = -inf and zero gradients.
//
// The flash-attention contract (Dao et al. 2022, "FlashAttention"; Dao 2023, "FlashAttention-2"):
// forward keeps only lse, the log-sum-exp of each query's scaled, masked scores, never the
// B x NH x T x T probabilities; backward recomputes P = exp(s - lse) and uses
// D = rowsum(dout * out), so dS = P * (dP - D) / sqrt(HS) with dP = dout v^T.
enum class AttentionMask : uint8_t { Causal, KeyPadding, CausalKeyPadding };

// Attention dropout (Megatron's attention_dropout) on the probabilities, inside the op, as
// FlashAttention applies it (Dao et al. 2022, Algorithm 2): out = (P Z) v with P the softmax (its
// normaliser and lse those of the undropped scores) and Z = keep / (1 - p). Probability
// P[b, h, t, key] is element ((b NH + h) T + t) T + key of the Philox stream (seed, stream) and is
// kept iff its bits are at least dropout_threshold(p), the Dropout op's rule (DropoutMask,
// backend/dropout_mask.h), so every back-end draws the same mask. The backward draws it again:
// dv = (P Z)^T dO, dP = (dO v^T) Z, and D = rowsum(dO * out) still (sum_k P Z dO.v = dO.out).
// probability 0: none.
struct AttentionDropout {
  float probability = 0.0f;  // in [0, 1)
  uint64_t seed = 0, stream = 0;
  bool active() const { return probability > 0.0f; }
  bool operator==(const AttentionDropout&) const = default;
};

// Output cast for the next fp8 product (the attention's c_proj): with `fp8` given (that product's
// Fp8Matmul::in; bf16 or fp16, B*T and C multiples of 16), out is written as without it (the
// backward reads it) and also cast as that product's forward would cast its input: its E4M3
// codes, fp8(out * scale), into out_fp8 ([B*T, C], the product's `in` as codes) and, transposed,
// out_fp8_t ([C, B*T], the product's in_fp8_t for its backward, or empty where no backward reads
// them); max |out| is max-accumulated into fp8->amax.
struct AttentionForward {
  Tensor out;       // [B, T, C]
  Tensor lse;       // [B, NH, T] fp32, saved for backward
  Tensor qkv;       // [B, T, 3C]
  Tensor key_mask;  // [B, T] int32 (1 keep, 0 pad); required for the padding variants
  int num_heads = 1;
  AttentionMask mask = AttentionMask::Causal;
  const Fp8Operand* fp8 = nullptr;      // cast the output for the next fp8 product (above), or null
  Tensor out_fp8 = {}, out_fp8_t = {};  // with fp8: [B*T, C] and [C, B*T] (or empty) E4M3 codes
  AttentionDropout dropout = {};        // on the probabilities (above)
};
// Gradient cast for the next fp8 product (c_attn's backward): with `fp8` given (that product's
// Fp8Matmul; bf16 or fp16, B*T and 3C multiples of 16), dqkv is cast as that backward would cast
// its output gradient: dqkv rounded to the compute dtype, its codes fp8(dqkv * fp8->dout.scale) in
// fp8->grad_dtype into dqkv_fp8 ([B*T, 3C]) and, transposed, dqkv_fp8_t ([3C, B*T]), max |dqkv|
// max-accumulated into fp8->dout.amax, and that backward's bias gradient, the column sums of
// dqkv, into dbias (+= or =, param_store; or empty). `dqkv` is then empty: the gradient is never
// stored in the compute dtype, and the backward reads the codes (MatmulBackward, dout cast already).
struct AttentionBackward {
  Tensor dqkv;      // [B, T, 3C] = (empty with fp8, above)
  Tensor dout;      // [B, T, C]
  Tensor qkv;       // the forward's inputs and results:
  Tensor out;       // [B, T, C]
  Tensor lse;       // [B, NH, T] fp32
  Tensor key_mask;  // as in forward
  int num_heads = 1;
  AttentionMask mask = AttentionMask::Causal;
  const Fp8Matmul* fp8 = nullptr;       // cast dqkv for this product's backward (above), or null
  Tensor dqkv_fp8 = {}, dqkv_fp8_t = {};  // with fp8: [B*T, 3C] and [3C, B*T] codes in fp8->grad_dtype
  Tensor dbias = {};                    // with fp8: [3C] fp32, += or = (param_store), or empty
  GradStore param_store = GradStore::Add;
  AttentionDropout dropout = {};        // the forward's (above)
};

// ---- fused softmax + cross-entropy over the vocabulary ----------------------------------------
// Softmax runs over the first `vocab_size` columns only; columns [vocab_size, Vp) are padding,
// never predicted, and get zero gradient. losses[m] = -log p[m, targets[m]], or 0 where
// targets[m] == ignore_index. With write_grad, logits are overwritten in place by
// d(loss_scale * sum_m losses[m])/d logits, i.e. (p - onehot) * loss_scale on counted rows and
// zero on ignored rows and padding columns.
//
// Gradient cast for the classifier's fp8 backward: with write_grad and `fp8` given (that product's
// Fp8Matmul; bf16 or fp16, M and Vp multiples of 16), the gradient is cast as that backward would
// cast its output gradient instead of being stored: the gradient rounded to the compute dtype, its
// codes fp8(grad * fp8->dout.scale) in fp8->grad_dtype into grad_fp8 ([M, Vp]) and, transposed,
// grad_fp8_t ([Vp, M]), max |grad| max-accumulated into fp8->dout.amax; the logits are then left
// as they were. The backward reads the codes as its dout (MatmulBackward, dout cast already).
struct SoftmaxCrossEntropy {
  Tensor logits;   // [M, Vp] in; gradient out when write_grad (not with fp8)
  Tensor losses;   // [M] out
  Tensor targets;  // [M] int32
  int64_t vocab_size = 0;
  int32_t ignore_index = kUncountedTarget;
  float loss_scale = 1.0f;
  bool write_grad = false;
  const Fp8Matmul* fp8 = nullptr;           // with write_grad: cast the gradient (above), or null
  Tensor grad_fp8 = {}, grad_fp8_t = {};  // with fp8: [M, Vp] and [Vp, M] codes in fp8->grad_dtype
};

// ---- AdamW with decoupled weight decay (Loshchilov & Hutter 2019) on flat fp32 buffers --------
// For each element: g = grad * grad_scale (unscaling and clipping folded in);
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m / (1-b1^step); vhat = v / (1-b2^step);
// master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master).
// Segments give each flat range its own weight decay (0 for biases and LayerNorm).
// param_out receives the updated master in the model's dtype; it may be the master itself.
struct AdamwSegment {
  int64_t offset = 0;
  int64_t count = 0;
  float weight_decay = 0.0f;
};
struct AdamwStep {
  Tensor master;     // [P] fp32
  Tensor param_out;  // [P] fp32, bf16 or fp16 (may alias master when fp32)
  Tensor grad;       // [P] fp32
  Tensor exp_avg;    // [P] fp32, first moment
  Tensor exp_avg_sq; // [P] fp32, second moment
  std::span<const AdamwSegment> segments;
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float grad_scale = 1.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

// ---- reductions over a flat gradient buffer ----------------------------------------------------
struct SumOfSquares {
  Tensor in;  // [P] fp32; the result is NaN/inf when any element is
};

// ---- fp8 delayed scaling: the next scales from the amax history, once per optimizer step ---------
// `state` holds one row per fp8 tensor: [scale, scale_inv, amax, fp8_max, history[H]] (fp32, the
// first three are the Fp8Operand views of the ops above; fp8_max is the format's largest finite
// value, 448 for E4M3 or 57344 for E5M2). For each row: history[position] = amax; a = max(history)
// when use_history_max, else amax (the most recent); when a is finite and positive,
// scale = fp8_max / a / 2^margin and scale_inv = 1 / scale (otherwise both stay); then amax = 0.
// Transformer Engine's DelayedScaling recipe with amax_compute_algo "max" or "most_recent".
struct Fp8UpdateScales {
  Tensor state;            // [tensors, 4 + history] fp32
  int64_t position = 0;    // the history slot to write, in [0, history)
  bool use_history_max = true;
  int margin = 0;
};
constexpr int64_t kFp8StateColumns = 4;  // scale, scale_inv, amax, fp8_max; the history follows

// ---- dropout (Srivastava et al. 2014), inverted: kept elements scaled by 1 / (1 - p) ---------------
// out[i] = keep(i) ? in[i] / (1 - p) : 0, where element i (in flat order) is kept when its 32 bits
// philox::bits(seed, stream, i) (core/philox.h) are at least dropout_threshold(p) = round(p 2^32):
// a mask that is a function of (seed, stream, i) alone, stored nowhere. The backward is the same
// op on the gradient, with the same seed and stream: din = keep(i) ? dout / (1 - p) : 0. So a
// recomputed forward and the backward draw the very mask of the forward, and every back-end draws
// the same bits. The caller picks the stream (a layer, micro-batch and iteration) and the seed (a
// run and rank). The scale is the fp32 value 1.0f / (1.0f - p); out may alias in.
// With `residual` (same dtype and numel) the op is the residual stream's fused dropout-add,
// out[i] = residual[i] + (keep(i) ? in[i] / (1 - p) : 0), summed in fp32 and rounded once; out may
// alias residual too. Its backward is the plain op on dout (the residual's gradient is dout).
struct Dropout {
  Tensor out;  // any floating compute dtype, same numel as in
  Tensor in;
  float probability = 0.0f;  // p, in [0, 1)
  uint64_t seed = 0, stream = 0;
  Tensor residual = {};  // empty: no residual added
};

// ---- elementwise utilities ----------------------------------------------------------------------
struct Fill {
  Tensor out;  // any floating dtype
  float value = 0.0f;
};
// out = in, element by element, between any two floating dtypes (rounded to nearest even when
// narrowing): fp32 master weights to bf16/fp16 model parameters and back.
// Cast for fp8 products that read a tensor already cast (MatmulForward's and MatmulBackward's
// weight_fp8): with `fp8` given (the products' Fp8Operand; `in` a bf16 or fp16 matrix [R, C], R and C
// multiples of 16), out receives the E4M3 codes fp8(in * fp8->scale) [R, C] and out_t their
// transpose [C, R], either of which may be empty (not both), and max |in| is max-accumulated into
// fp8->amax: the cast those products would each have made.
struct Convert {
  Tensor out;  // with fp8: [R, C] E4M3 codes, or empty
  Tensor in;   // same element count as out
  const Fp8Operand* fp8 = nullptr;  // cast to fp8 codes (above), or null
  Tensor out_t = {};                // with fp8: [C, R] E4M3 codes, or empty
};

}  // namespace kiln
