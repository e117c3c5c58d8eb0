// Attention on sequences of several tiles (64 rows for the tensor-core kernels, 16 and 32 for the
// general ones), CUDA against the CPU reference: the op table's cases are short (its
// double-precision finite differences are O(T^4)), so this is where the fused kernels' multi-tile
// paths (online softmax across key tiles, causal tiles skipped, the backward's loops over query
// and key tiles, a partial last tile) are checked, on wgmma where the GPU has it (H100/H200) and
// on mma.sync (the default), each with the backward deterministic and adding dQ
// atomically (--no-deterministic-attention), and the cuBLAS path the fused kernels replace
// (--no-fused-attention) too; and cuDNN's engines (--cudnn-attention) where they take the call, kiln's
// kernels where they do not (key padding, head sizes off cuDNN's multiples of 8). Same inputs on
// both back-ends; out, lse and dqkv compared by normalised error. Skips without a GPU (and the cuDNN
// case without a loadable cuDNN 9); on the emulator the cuDNN case runs its stand-in, which checks
// kiln's graphs, layouts and bindings, not NVIDIA's engines.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <regex>
#include <string>
#include <tuple>

#include "kiln/backend/registry.h"
#include "kiln/core/rng.h"
#include "support/backends.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

struct AttentionResult {
  std::vector<float> out, lse, dqkv;
};

AttentionResult run_attention(Backend& backend, DType dtype, int64_t B, int64_t T, int64_t NH, int64_t HS,
                              AttentionMask mask, const std::vector<float>& qkv_host,
                              const std::vector<float>& dout_host, const std::vector<int32_t>& key_mask) {
  const int64_t C = NH * HS;
  DeviceTensors t(backend, dtype);
  const Tensor qkv = t.acts(qkv_host, {B, T, 3 * C});
  const Tensor out = t.poisoned_acts({B, T, C}), lse = t.poisoned({B * NH * T}), dqkv = t.poisoned_acts({B, T, 3 * C});
  const Tensor mask_tensor = mask == AttentionMask::Causal ? Tensor{} : t.ints(key_mask, {B, T});
  backend.attention_forward({out, lse, qkv, mask_tensor, static_cast<int>(NH), mask});
  backend.attention_backward({dqkv, t.acts(dout_host, {B, T, C}), qkv, out, lse, mask_tensor, static_cast<int>(NH), mask});
  return {t.download(out), t.download(lse), t.download(dqkv)};
}

class LongAttention : public ::testing::TestWithParam<std::tuple<std::string, int64_t, AttentionMask>> {
 protected:
  // The case's inputs (B = 2, T = 150, NH = 2), the CPU's results on them, and the tolerance for out
  // and lse (twice it for dqkv).
  void SetUp() override {
    const auto [dtype_name_, head_size, mask_] = GetParam();
    dtype = dtype_name_ == "bf16" ? DType::BF16 : DType::F16;
    HS = head_size;
    mask = mask_;
    const int64_t C = NH * HS;
    Rng rng(31);
    qkv = rounded_to(dtype, random_floats(static_cast<size_t>(B * T * 3 * C), rng));
    dout = rounded_to(dtype, random_floats(static_cast<size_t>(B * T * C), rng));
    key_mask.assign(static_cast<size_t>(B * T), 1);
    for (int64_t i = 0; i < B * T; i += 7) key_mask[static_cast<size_t>(i)] = 0;  // padding inside every tile
    key_mask[0] = 0;  // with causal: query 0 of batch 0 sees no key at all
    bound = dtype == DType::BF16 ? 2e-2 : 4e-3;
  }
  AttentionResult run_on(Backend& backend) const {
    return run_attention(backend, dtype, B, T, NH, HS, mask, qkv, dout, key_mask);
  }

  static constexpr int64_t B = 2, T = 150, NH = 2;
  DType dtype = DType::BF16;
  int64_t HS = 0;
  AttentionMask mask = AttentionMask::Causal;
  std::vector<float> qkv, dout;
  std::vector<int32_t> key_mask;
  double bound = 0.0;
};

TEST_P(LongAttention, CudaMatchesTheCpuAcrossTiles) {
  const std::string reason = backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  const AttentionResult expected = run_on(*make_backend("cpu"));
  for (const auto& [fused, warpgroup, deterministic] :
       {std::tuple{true, true, true}, {true, true, false}, {true, false, true}, {true, false, false},
        {false, false, true}}) {
    auto gpu = make_backend("cuda", BackendOptions{false, fused, true, warpgroup, deterministic});
    const AttentionResult actual = run_on(*gpu);
    const std::string path = std::string(!fused      ? "materialised"
                                         : warpgroup ? "fused (wgmma where it runs)"
                                                     : "fused, mma.sync") +
                             (deterministic ? "" : ", dQ added atomically");
    EXPECT_LT(normalized_error(actual.out, expected.out), bound) << path;
    EXPECT_LT(normalized_error_with_infinities(actual.lse, expected.lse), bound) << path;
    EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2 * bound) << path;
  }
}

TEST_P(LongAttention, CudnnMatchesTheCpuWhereItTakesTheCall) {
  const std::string reason = backend_skip_reason("cuda");
  if (!reason.empty()) GTEST_SKIP() << reason;
  BackendOptions with_cudnn;
  with_cudnn.cudnn_attention = true;
  std::unique_ptr<Backend> gpu;
  try {
    gpu = make_backend("cuda", with_cudnn);
  } catch (const std::exception& error) {
    GTEST_SKIP() << error.what();
  }
  const AttentionResult expected = run_on(*make_backend("cpu"));
  const AttentionResult actual = run_on(*gpu);
  const bool cudnn_takes_it = mask == AttentionMask::Causal && HS % 8 == 0 && HS <= 128;
  const std::string notes = gpu->run_notes();
  std::smatch calls;
  ASSERT_TRUE(std::regex_search(notes, calls, std::regex("attention forward calls on cuDNN [^:]*: ([0-9]+)"))) << notes;
  EXPECT_EQ(calls[1].str(), cudnn_takes_it ? "1" : "0") << notes;
  EXPECT_LT(normalized_error(actual.out, expected.out), bound);
  EXPECT_LT(normalized_error_with_infinities(actual.lse, expected.lse), bound);
  EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2 * bound);
}

std::string case_name(const ::testing::TestParamInfo<LongAttention::ParamType>& info) {
  const AttentionMask mask = std::get<2>(info.param);
  return std::get<0>(info.param) + "_HS" + std::to_string(std::get<1>(info.param)) + "_" +
         (mask == AttentionMask::Causal ? "causal" : mask == AttentionMask::KeyPadding ? "padding" : "causal_padding");
}

// On sm_80+, head sizes 64 and 128 fill the tensor-core tiles, 24 and 80 are zero-padded inside
// them, and 20 (not a multiple of 8) and 256 (wider than a tile) take the general fused kernels.
INSTANTIATE_TEST_SUITE_P(Cuda, LongAttention,
                         ::testing::Combine(::testing::Values("bf16", "fp16"), ::testing::Values(64, 128, 80, 24, 20, 256),
                                            ::testing::Values(AttentionMask::Causal, AttentionMask::KeyPadding,
                                                              AttentionMask::CausalKeyPadding)),
                         case_name);

}  // namespace
}  // namespace kiln::testing
