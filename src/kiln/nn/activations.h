// The activation plan (ARCHITECTURE.md decision 4): every tensor the forward keeps for backward,
// and the scratch the backward needs, laid out in one Arena.
//
// lay_out() is the single description of that memory: run on a measuring Arena it returns the
// bytes needed for (batch, seq); run on a real Arena it binds the views. A plan made for
// (B, T) can be re-laid for any smaller (b, t) in the same arena (generation uses this).
//
// Kept per block (what backward reads): ln1 out + stats, qkv, the attention output and its
// log-sum-exp (the attention op never keeps the T x T probabilities, ops.h), the residual after
// attention, ln2 out + stats, the MLP pre- and post-GELU activations and the block output.
// Both projections write the residual stream, x + projection, directly (block.h). Under a
// recompute policy (recompute.h), recomputed blocks' views point into shared scratch slots (only
// a chunk's last output is kept, as the next chunk's input); under selective recomputation every
// block's GELU output is one shared buffer.
// The classifier and loss run on at most `logit_rows` positions at a time (Gpt::forward), so the
// logits buffer holds min(logit_rows, batch x seq) rows, never the whole batch's.
// Buffers whose lifetimes never overlap share one stretch of the arena (ArenaOverlay), as large
// as the largest of them: the logits chunk (the classifier and
// loss at the end of forward, whose backward runs there too; logits_at() later), d_fc (the MLP's
// backward) and d_qkv (attention's backward); each block's backward is done with d_fc before it
// writes d_qkv. d_residual and d_hidden (which carries d ln_f from forward to backward) stay apart.
// fp8 products (Model::enable_fp8): each block product's backward reads the E4M3 codes of its input,
// transposed, kept from forward for its weight gradient (ops.h, in_fp8_t). The ops before c_attn,
// c_fc and the MLP's c_proj (ln_1, ln_2 and c_fc's GELU) write only their outputs' codes, in both
// layouts (ops.h, LayerNormForward with fp8, MatmulForward with gelu_fp8); the attention writes
// its output (which its backward reads) and its codes for its c_proj (AttentionForward with fp8).
// So nothing reads a 16-bit LayerNorm or GELU output: ln1 and ln2 of every block are one shared
// buffer of the codes in the product's layout ([B*T, C] E4M3), which also takes the attention
// output's codes between c_attn's read of ln1's and ln_2's write (attn_out_fp8), and the GELU
// output is one shared buffer of codes too ([B*T, 4C]). Per token and layer that keeps 7C bytes
// of codes in place of 12C bytes of 16-bit activations. Under selective recomputation the GELU
// output's codes are not kept but recomputed before each backward, transposed, from the kept
// pre-activation (ops.h, GeluForward with fp8) into the shared buffer of the forward's GELU codes,
// which no backward reads (gelu_codes_recomputed); without fp8 the GELU output itself is, into the
// shared fc_post_gelu. In the backward each LayerNorm writes the residual stream's gradient also as
// codes, by rows then by columns, for the projection reading it next (LayerNormBackward with fp8,
// block.h): one buffer of 2 B*T C bytes of its own (d_residual_fp8), since ln_1's codes outlive the
// previous block's forward replay and every scratch buffer free then is written by the product
// that reads them; no two LayerNorms' codes are in use at once. Under hidden dropout no LayerNorm
// casts them (the projections read the gradient dropped and cast it themselves, block.h): no
// buffer. With the classifier's products in fp8 too, the cross-entropy writes the chunk's
// logits' gradient only as codes, by rows then by columns (ops.h, SoftmaxCrossEntropy with fp8),
// for the classifier's backward: logit_codes, as many bytes as the logits chunk, beside it in
// the same stretch (both are in use at once; the codes cannot take the logits' own memory, which
// the cross-entropy reads while it writes them).
// Every chunk's products read wte's E4M3 codes, cast once before the first chunk in both layouts
// (ops.h, Convert with fp8; the products' weight_fp8): wte_fp8 and wte_fp8_t, 2 Vp C bytes in that
// stretch too, in place of two casts of wte a chunk.
// Dtypes (ops.h): activations and their gradients in the model's compute dtype; LayerNorm
// statistics and losses in fp32; token ids int32; kept fp8 codes fp8_e4m3.
#pragma once

#include <vector>

#include "kiln/core/arena.h"
#include "kiln/core/tensor.h"
#include "kiln/nn/gpt_config.h"
#include "kiln/nn/recompute.h"

namespace kiln {

struct BlockActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // [B,T,C] (fp8: [B*T,C] codes, above), [B*T], [B*T]
  Tensor qkv;                      // [B,T,3C]
  Tensor attn_out;                 // [B,T,C] attention core output, input of c_proj
  Tensor attn_lse;                 // [B,NH,T] fp32 log-sum-exp of each query's scores
  Tensor residual_mid;             // [B,T,C] residual after attention
  Tensor ln2, ln2_mean, ln2_rstd;
  Tensor fc_pre_gelu;              // [B,T,4C]
  Tensor fc_post_gelu;             // [B,T,4C] (fp8: [B*T,4C] codes, above)
  Tensor residual_out;             // [B,T,C] block output
  // fp8 products only, else empty: the E4M3 codes of each product's input, transposed, [K, B*T]
  // (the GELU output's only where it is not recomputed). fc_post_gelu_fp8_t is written by c_fc.
  Tensor ln1_fp8_t, attn_out_fp8_t, ln2_fp8_t, fc_post_gelu_fp8_t;
  Tensor attn_out_fp8;  // fp8 only: [B*T, C] E4M3 codes of attn_out for c_proj (the shared ln codes, above)
};

// Views handed out from an arena (a measuring one gives views without data): take() in the
// model's compute dtype, stats() in fp32, ints() in int32, codes() in fp8 E4M3.
class ActivationLayout {
 public:
  ActivationLayout(Arena& arena, Device device, DType dtype) : arena_(arena), device_(device), dtype_(dtype) {}
  Tensor take(Shape shape) { return take_as(shape, dtype_); }
  Tensor stats(Shape shape) { return take_as(shape, DType::F32); }
  Tensor ints(Shape shape) { return take_as(shape, DType::I32); }
  Tensor codes(Shape shape) { return take_as(shape, DType::F8E4M3); }

 private:
  Tensor take_as(Shape shape, DType dtype);
  Arena& arena_;
  Device device_;
  DType dtype_;
};

// A model's stack of blocks (block_stack.h) under a recompute policy: recomputed blocks' views
// point into shared scratch slots, only a chunk's last output kept (the next chunk's input); under
// selective recomputation every block's GELU output is one shared buffer; with fp8 the LayerNorm
// and GELU outputs are shared buffers of codes (above).
struct BlockStackActivations {
  std::vector<BlockActivations> blocks;
  std::vector<LayerRecompute> recompute;  // per layer, from the policy
  // Selective recomputation with fp8 only: [4C, B*T] codes of the GELU output, recomputed before
  // each backward (the forward's shared buffer of GELU codes), else empty.
  Tensor gelu_codes_recomputed;

  // `layers` blocks of width `hidden` and `heads` heads for (batch, seq); `fp8`: the blocks' products
  // are fp8, so their inputs' codes are kept. Errors name the config key when the policy does not
  // fit the depth.
  static BlockStackActivations lay_out(ActivationLayout& layout, int64_t layers, int64_t batch, int64_t seq,
                                       int64_t hidden, int64_t heads, const RecomputePolicy& policy, bool fp8);
};

// Positions per classifier chunk: large enough for efficient products (4096 x C x V), small
// enough that the logits stay a fraction of the activations (GPT-2: 412 MB in bf16).
constexpr int64_t kDefaultLogitRows = 4096;

struct GptActivations {
  int64_t batch = 0, seq = 0;
  Tensor tokens, targets;          // [B,T] int32
  Tensor embedded;                 // [B,T,C] input of block 0
  BlockStackActivations stack;     // the blocks' activations, under the recompute policy
  Tensor lnf, lnf_mean, lnf_rstd;
  Tensor logits;                   // [min(logit_rows, B*T), Vp]: one chunk's logits, then their gradient (shared)
  Tensor logit_codes;              // fp8 classifier only: [2, min(logit_rows, B*T), Vp], the chunk's logits'
                                   // gradient as codes by rows then by columns (above), else empty
  Tensor wte_fp8, wte_fp8_t;       // fp8 classifier only: [Vp, C] and [C, Vp] E4M3 codes of wte (above)
  Tensor losses;                   // [B*T]
  // Backward scratch.
  Tensor d_residual;               // [B,T,C]
  Tensor d_hidden;                 // [B,T,C] gradients of ln outputs and of attn_out; holds
                                   // d ln_f between a training forward and backward
  Tensor d_qkv;                    // [B,T,3C] (shared)
  Tensor d_fc;                     // [B,T,4C] gradient of both MLP activations, in place (shared)
  Tensor d_residual_fp8;           // fp8 without hidden dropout: [2 x B*T x C] codes of d_residual (above), else empty

  // Lays out every tensor for (batch, seq) in `arena` and returns the views (null data when the
  // arena is measuring). `device` tags the views; `dtype` is the compute dtype; `fp8`: the blocks'
  // products are fp8 (their inputs' codes are kept, above); `fp8_classifier`: the classifier's too
  // (its logits' gradient comes as codes, above).
  static GptActivations lay_out(Arena& arena, const GptConfig& config, int64_t batch, int64_t seq,
                                Device device, const RecomputePolicy& policy = {}, DType dtype = DType::F32,
                                int64_t logit_rows = kDefaultLogitRows, bool fp8 = false,
                                bool fp8_classifier = false);
  static size_t bytes_needed(const GptConfig& config, int64_t batch, int64_t seq,
                             const RecomputePolicy& policy = {}, DType dtype = DType::F32,
                             int64_t logit_rows = kDefaultLogitRows, bool fp8 = false, bool fp8_classifier = false);
};

}  // namespace kiln
