// The activation plan shares memory only between buffers whose lifetimes never overlap
// (activations.h): every pair of distinct views that overlap must both be in the shared stretch.
// Views that are the same buffer (recomputation's scratch slots, selective recomputation's
// GELU output, the LayerNorm and GELU outputs with fp8 products) count as one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/arena.h"
#include "kiln/nn/activations.h"

namespace kiln {
namespace {

struct Range {
  const char* begin;
  size_t bytes;
  bool operator<(const Range& other) const {
    return begin != other.begin ? begin < other.begin : bytes < other.bytes;
  }
};

// Every view of the plan, by range, with the names that use it.
std::map<Range, std::set<std::string>> views_of(const GptActivations& acts) {
  std::map<Range, std::set<std::string>> views;
  auto add = [&](const std::string& name, const Tensor& tensor) {
    views[{static_cast<const char*>(tensor.data), tensor.bytes()}].insert(name);
  };
  add("tokens", acts.tokens);
  add("targets", acts.targets);
  add("embedded", acts.embedded);
  for (size_t layer = 0; layer < acts.stack.blocks.size(); ++layer) {
    const BlockActivations& b = acts.stack.blocks[layer];
    for (const auto& [name, tensor] :
         {std::pair<const char*, const Tensor&>{"ln1", b.ln1}, {"ln1_mean", b.ln1_mean}, {"ln1_rstd", b.ln1_rstd},
          {"qkv", b.qkv}, {"attn_out", b.attn_out}, {"attn_lse", b.attn_lse}, {"residual_mid", b.residual_mid},
          {"ln2", b.ln2}, {"ln2_mean", b.ln2_mean}, {"ln2_rstd", b.ln2_rstd}, {"fc_pre_gelu", b.fc_pre_gelu},
          {"fc_post_gelu", b.fc_post_gelu}, {"residual_out", b.residual_out}, {"ln1_fp8_t", b.ln1_fp8_t},
          {"attn_out_fp8_t", b.attn_out_fp8_t}, {"ln2_fp8_t", b.ln2_fp8_t},
          {"fc_post_gelu_fp8_t", b.fc_post_gelu_fp8_t}})
      if (!tensor.empty()) add(fmt::format("{}[{}]", name, layer), tensor);
  }
  add("lnf", acts.lnf);
  add("lnf_mean", acts.lnf_mean);
  add("lnf_rstd", acts.lnf_rstd);
  add("logits", acts.logits);
  add("losses", acts.losses);
  add("d_residual", acts.d_residual);
  add("d_hidden", acts.d_hidden);
  add("d_qkv", acts.d_qkv);
  add("d_fc", acts.d_fc);
  if (!acts.stack.gelu_codes_recomputed.empty()) add("gelu_codes_recomputed", acts.stack.gelu_codes_recomputed);
  if (!acts.d_residual_fp8.empty()) add("d_residual_fp8", acts.d_residual_fp8);
  return views;
}

GptConfig small_config() {
  GptConfig config;
  config.num_layers = 4;
  config.hidden_size = 32;
  config.num_heads = 2;
  config.vocab_size = 200;
  config.max_position_embeddings = 16;
  return config;
}

const RecomputePolicy kPolicies[] = {RecomputePolicy{}, RecomputePolicy::parse("full", "uniform", 2),
                                     RecomputePolicy::parse("full", "block", 3),
                                     RecomputePolicy::parse("selective", "", 1)};

TEST(Activations, OnlyBuffersWithDisjointLifetimesShareMemory) {
  const GptConfig config = small_config();
  const std::set<std::string> shared = {"logits", "d_qkv", "d_fc"};
  for (const bool fp8 : {false, true})
  for (const RecomputePolicy& policy : kPolicies) {
    SCOPED_TRACE(fp8 ? "fp8" : "no fp8");
    const size_t bytes = GptActivations::bytes_needed(config, 3, 16, policy, DType::BF16, kDefaultLogitRows, fp8);
    Arena arena(bytes);
    const GptActivations acts =
        GptActivations::lay_out(arena, config, 3, 16, Device::CPU, policy, DType::BF16, kDefaultLogitRows, fp8);
    EXPECT_EQ(arena.used(), bytes);
    const auto views = views_of(acts);
    std::set<std::string> seen_sharing;
    for (auto a = views.begin(); a != views.end(); ++a) {
      for (auto b = std::next(a); b != views.end(); ++b) {
        if (b->first.begin >= a->first.begin + a->first.bytes) break;  // sorted by start: no later one overlaps a
        for (const std::string& name : a->second) {
          EXPECT_TRUE(shared.count(name)) << name << " overlaps " << *b->second.begin() << " (" << policy.describe()
                                          << ")";
          seen_sharing.insert(name);
        }
        for (const std::string& name : b->second) {
          EXPECT_TRUE(shared.count(name)) << name << " overlaps " << *a->second.begin() << " (" << policy.describe()
                                          << ")";
          seen_sharing.insert(name);
        }
      }
    }
    EXPECT_EQ(seen_sharing, shared) << policy.describe();  // the three do share, at one start
    EXPECT_EQ(acts.logits.data, acts.d_fc.data);
    EXPECT_EQ(acts.d_qkv.data, acts.logits.data);
  }
}

// With fp8 products every block keeps its products' input codes, [K, B*T] in fp8_e4m3, and the
// codes of its LayerNorm outputs and GELU output (which the LayerNorms and c_fc write, ops.h) are
// buffers all blocks share; under selective recomputation the GELU output's codes are not kept but
// recomputed, transposed, into the memory of the forward's (which no backward reads). Under full
// recomputation a chunk's last block replays no MLP c_proj (block.h), but its c_fc writes the codes
// that product's backward reads, so every recompute slot keeps them.
TEST(Activations, Fp8ProductsKeepTheirInputsCodesInsteadOfTheInputs) {
  const GptConfig config = small_config();
  const int64_t C = config.hidden_size, M = 3 * 16, L = config.num_layers;
  // Per policy of kPolicies, the layers whose MLP c_proj input codes are kept.
  const std::vector<std::vector<bool>> mlp_codes_kept = {
      {true, true, true, true}, {true, true, true, true}, {true, true, true, true}, {false, false, false, false}};
  for (size_t p = 0; p < std::size(kPolicies); ++p) {
    const RecomputePolicy& policy = kPolicies[p];
    SCOPED_TRACE(policy.describe());
    const size_t bytes = GptActivations::bytes_needed(config, 3, 16, policy, DType::BF16, kDefaultLogitRows, true);
    Arena arena(bytes);
    const GptActivations acts =
        GptActivations::lay_out(arena, config, 3, 16, Device::CPU, policy, DType::BF16, kDefaultLogitRows, true);
    for (size_t layer = 0; layer < acts.stack.blocks.size(); ++layer) {
      const BlockActivations& block = acts.stack.blocks[layer];
      EXPECT_EQ(block.ln1.data, acts.stack.blocks[0].ln1.data);
      EXPECT_EQ(block.ln2.data, acts.stack.blocks[0].ln1.data);
      EXPECT_EQ(block.ln1.dtype, DType::F8E4M3);
      EXPECT_EQ(block.ln1.shape, (Shape{M, C}));
      EXPECT_EQ(block.fc_post_gelu.data, acts.stack.blocks[0].fc_post_gelu.data);
      EXPECT_EQ(block.fc_post_gelu.dtype, DType::F8E4M3);
      EXPECT_EQ(block.fc_post_gelu.numel(), 4 * C * M);
      for (const Tensor* codes : {&block.ln1_fp8_t, &block.attn_out_fp8_t, &block.ln2_fp8_t}) {
        EXPECT_EQ(codes->dtype, DType::F8E4M3);
        EXPECT_EQ(codes->shape, (Shape{C, M}));
      }
      if (mlp_codes_kept[p][layer]) {
        EXPECT_EQ(block.fc_post_gelu_fp8_t.shape, (Shape{4 * C, M})) << "layer " << layer;
      } else {
        EXPECT_TRUE(block.fc_post_gelu_fp8_t.empty()) << "layer " << layer;
      }
    }
    const bool selective = policy.granularity == RecomputeGranularity::Selective;
    EXPECT_EQ(acts.stack.gelu_codes_recomputed.shape, (selective ? Shape{4 * C, M} : Shape{})) << policy.describe();
    // The forward's GELU codes are dead before any backward: the recomputed ones take their memory.
    if (selective) {
      EXPECT_EQ(acts.stack.gelu_codes_recomputed.data, acts.stack.blocks[0].fc_post_gelu.data);
    }
    // The backward's codes of the residual stream's gradient, by rows and by columns: one buffer.
    EXPECT_EQ(acts.d_residual_fp8.shape, (Shape{2, M, C}));
    // Without recomputation: per layer 6C bf16 values (12C bytes) per position give way to 7C
    // bytes of codes, and the shared codes of the LayerNorm outputs (C bytes), of the GELU
    // output (4C bytes) and of the residual gradient (2C bytes) are laid out once.
    if (policy.granularity == RecomputeGranularity::None) {
      EXPECT_EQ(bytes, GptActivations::bytes_needed(config, 3, 16, policy, DType::BF16) -
                           static_cast<size_t>((L * 12 * C - 5 * C - 2 * C - L * 7 * C) * M));
    }
    // Under hidden dropout no LayerNorm casts that gradient (each projection casts it dropped,
    // block.h): no buffer, 2C bytes a position fewer.
    GptConfig dropping = config;
    dropping.hidden_dropout = 0.1f;
    const size_t without_codes =
        GptActivations::bytes_needed(dropping, 3, 16, policy, DType::BF16, kDefaultLogitRows, true);
    EXPECT_EQ(without_codes, bytes - static_cast<size_t>(2 * C * M));
    Arena dropping_arena(without_codes);
    EXPECT_TRUE(GptActivations::lay_out(dropping_arena, dropping, 3, 16, Device::CPU, policy, DType::BF16,
                                        kDefaultLogitRows, true)
                    .d_residual_fp8.empty());
  }
}

}  // namespace
}  // namespace kiln
