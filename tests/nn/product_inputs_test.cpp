// Every product's backward reads the input its forward read: the activation plan (activations.h)
// never lets a buffer a backward still needs be overwritten first, under every recomputation
// policy, and with fp8 products each backward reads the codes its own forward kept (ops.h,
// in_fp8_t), or for c_attn and c_fc those the LayerNorm before it wrote for it (LayerNormForward
// with fp8), for the attention's c_proj those the attention wrote (AttentionForward with fp8) and
// for the MLP's c_proj those c_fc wrote (MatmulForward with gelu_fp8), untouched since, while the
// 16-bit inputs those codes replace are shared and reused. No codes are kept that no backward
// reads (a recomputed block's first forward and a forward without gradients keep none). Each fp8
// backward reads its output gradient as the codes cast for it (with its own Fp8Matmul), untouched
// since, and every such cast is read: c_attn's by the attention backward (AttentionBackward with
// fp8), both projections' by the LayerNorm backward after them (LayerNormBackward with fp8: ln_2's
// for the attention's c_proj, ln_f's and ln_1's for the MLP c_proj before them, across a
// recomputed chunk's replay), c_fc's by the MLP c_proj's backward (MatmulBackward with
// din_reader). A CPU back-end records what each product's forward read, by weight, and each
// gradient cast, by codes, and compares at backward.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/core/rng.h"
#include "kiln/nn/gpt.h"

namespace kiln {
namespace {

std::vector<char> contents(const Tensor& tensor) {
  if (tensor.empty()) return {};
  const char* data = static_cast<const char*>(tensor.data);
  return std::vector<char>(data, data + tensor.bytes());
}

// The bytes of codes [M, K] transposed, [K, M]: what a backward reads of codes its forward read.
std::vector<char> transposed(const Tensor& codes) {
  const std::vector<char> rows = contents(codes);
  const int64_t K = codes.shape[codes.shape.rank - 1], M = codes.numel() / K;
  std::vector<char> columns(rows.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) columns[k * M + m] = rows[m * K + k];
  return columns;
}

class ProductInputWatcher final : public CpuBackend {
 public:
  void layernorm_forward(const LayerNormForward& args) override {
    CpuBackend::layernorm_forward(args);
    if (args.fp8) last_cast_codes_ = args.out_fp8.data;
    note_kept_codes_written(args.out_fp8_t);
  }
  void attention_forward(const AttentionForward& args) override {
    CpuBackend::attention_forward(args);
    if (args.fp8) last_cast_codes_ = args.out_fp8.data;
    note_kept_codes_written(args.out_fp8_t);
  }
  void attention_backward(const AttentionBackward& args) override {
    CpuBackend::attention_backward(args);
    if (args.fp8) note_gradient_codes_written(args.fp8, args.dqkv_fp8, args.dqkv_fp8_t);
  }
  void layernorm_backward(const LayerNormBackward& args) override {
    CpuBackend::layernorm_backward(args);
    if (args.fp8) note_gradient_codes_written(args.fp8, args.din_fp8, args.din_fp8_t);
  }
  void matmul_forward(const MatmulForward& args) override {
    CpuBackend::matmul_forward(args);
    note_kept_codes_written(args.in_fp8_t);
    note_kept_codes_written(args.gelu_out_t);
    if (args.in.dtype == DType::F8E4M3) {  // cast by the op before it, which keeps the transpose
      EXPECT_EQ(args.in.data, last_cast_codes_) << "a product reads codes the last cast did not write";
      seen_[args.weight.data] = {contents(args.in), transposed(args.in)};
    } else {
      seen_[args.weight.data] = {contents(args.in), contents(args.in_fp8_t)};
    }
    if (args.gelu_fp8) last_cast_codes_ = args.gelu_out.data;
  }
  void matmul_backward(const MatmulBackward& args) override {
    const auto seen = seen_.find(args.weight.data);
    ASSERT_NE(seen, seen_.end()) << "a product's backward before its forward";
    if (!args.dout_fp8_t.empty()) {  // cast for it by the op after its output in forward
      const auto cast = gradient_codes_.find(args.dout.data);
      ASSERT_NE(cast, gradient_codes_.end()) << "a backward reads gradient codes no cast wrote";
      EXPECT_EQ(cast->second.product, args.fp8) << "a backward reads gradient codes cast for another product";
      EXPECT_TRUE(contents(args.dout) == cast->second.rows && contents(args.dout_fp8_t) == cast->second.columns)
          << "a backward's gradient codes changed since their cast";
      gradient_codes_.erase(cast);
      ++from_gradient_codes;
    }
    if (args.in_fp8_t.empty()) {
      EXPECT_TRUE(contents(args.in) == seen->second.in)
          << "a backward's input changed since its forward";
      ++from_input;
    } else {
      EXPECT_TRUE(contents(args.in_fp8_t) == seen->second.codes_t)
          << "a backward's kept codes are not those its forward read, transposed";
      ++from_codes;
      unread_codes_.erase(args.in_fp8_t.data);
    }
    CpuBackend::matmul_backward(args);
    if (args.din_reader) note_gradient_codes_written(args.din_reader, args.din_fp8, args.din_fp8_t);
  }
  int from_input = 0, from_codes = 0, from_gradient_codes = 0;
  // Codes kept for a backward that were written again before any backward read them.
  int overwritten_unread = 0;
  // Codes kept for a backward that no backward has read.
  size_t unread() const { return unread_codes_.size(); }
  // Gradient casts written over before their backward read them, and not read (yet).
  int gradient_codes_overwritten_unread = 0;
  size_t unread_gradient_codes() const { return gradient_codes_.size(); }

 private:
  void note_kept_codes_written(const Tensor& codes_t) {
    if (codes_t.empty()) return;
    overwritten_unread += unread_codes_.count(codes_t.data) ? 1 : 0;
    unread_codes_.insert(codes_t.data);
  }
  void note_gradient_codes_written(const Fp8Matmul* product, const Tensor& rows, const Tensor& columns) {
    gradient_codes_overwritten_unread += gradient_codes_.count(rows.data) ? 1 : 0;
    gradient_codes_[rows.data] = {product, contents(rows), contents(columns)};
  }
  struct Seen {
    std::vector<char> in;       // the input the forward read (codes, or 16-bit)
    std::vector<char> codes_t;  // the codes its backward must read: the input's, transposed
  };
  std::map<void*, Seen> seen_;  // by weight
  void* last_cast_codes_ = nullptr;  // written by the last LayerNorm, GELU or attention that cast its output
  struct GradientCast {
    const Fp8Matmul* product;  // the backward it was cast for
    std::vector<char> rows, columns;
  };
  std::map<void*, GradientCast> gradient_codes_;  // by the codes' rows, until a backward reads them
  std::set<void*> unread_codes_;
};

TEST(ProductInputs, EachBackwardReadsWhatItsForwardRead) {
  GptConfig config;
  config.num_layers = 3;
  config.hidden_size = 32;
  config.num_heads = 2;
  config.vocab_size = 61;
  config.max_position_embeddings = 8;
  constexpr int64_t B = 2, T = 8;  // 16 positions: fp8 products need multiples of 16
  Rng rng(5);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng.below(61));
    targets[i] = static_cast<int32_t>(rng.below(61));
  }
  const RecomputePolicy policies[] = {RecomputePolicy{}, RecomputePolicy::parse("selective", "", 1),
                                      RecomputePolicy::parse("full", "uniform", 2),
                                      RecomputePolicy::parse("full", "block", 2)};
  for (const bool fp8 : {false, true})
    for (const RecomputePolicy& policy : policies) {
      SCOPED_TRACE(policy.describe() + (fp8 ? ", fp8" : ""));
      ProductInputWatcher backend;
      Gpt model(config, backend, DType::BF16);
      model.init_weights(1);
      if (fp8) model.enable_fp8(Fp8Recipe{});
      model.allocate_activations(B, T, policy);
      for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
        model.forward(tokens, targets, B, T, micro_batch == 0 ? GradientPass::Write : GradientPass::Add, 1.0f);
        model.backward();
      }
      // A validation forward keeps nothing for a backward.
      model.forward(tokens, targets, B, T);
      // Codes kept for a backward are written only by the forward whose results it reads: a
      // recomputed block's first forward keeps none (its replay does), nor does a forward without
      // gradients.
      EXPECT_EQ(backend.overwritten_unread, 0);
      EXPECT_EQ(backend.unread(), 0u);
      // Per micro-batch: the classifier's product and each block's four, the MLP c_proj's under
      // selective recomputation from the codes recomputed before its backward.
      const int kept = fp8 ? 4 * static_cast<int>(config.num_layers) : 0;
      EXPECT_EQ(backend.from_codes, 2 * kept);
      // Per micro-batch and layer, c_attn's, both projections' and c_fc's.
      EXPECT_EQ(backend.from_gradient_codes, fp8 ? 2 * 4 * static_cast<int>(config.num_layers) : 0);
      EXPECT_EQ(backend.gradient_codes_overwritten_unread, 0);
      EXPECT_EQ(backend.unread_gradient_codes(), 0u);
      EXPECT_EQ(backend.from_input, 2 * (1 + 4 * static_cast<int>(config.num_layers) - kept));
    }
}

}  // namespace
}  // namespace kiln
