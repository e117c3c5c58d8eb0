// The fused attention kernels on the CPU emulator (cuda_emulator.h), called directly, for what the
// back-end-level tests on the emulator (Cuda/LongAttention in kiln_tests_on_emulator, which run
// whichever kernels an sm_90a device takes: wgmma) do not reach: the tensor-core kernels on
// mma.sync (what sm_80 and sm_89 GPUs run), the general CUDA-core kernels
// (general_attention.cu) at head sizes the tensor-core tiles take on sm_80+ (64, 128) and so run
// only on older GPUs, and at a 4-wide head; the tensor-core backward that adds dQ atomically
// (--no-deterministic-attention) on both; and, for every kernel family, that the results do not
// depend on the order in which a block's threads run. Same inputs as LongAttention: T = 150 across
// tiles of 64 (blocks of 16 and 32) with a partial last one, every mask, padding inside every
// tile, a query that sees no key; compared with the CPU back-end by normalised error, bounds as
// the CUDA op table's (ops_test.cpp) for out and lse, twice that for dqkv.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "host_tensor.h"
#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/core/rng.h"

namespace kiln::testing {
namespace {

// The tensor-core tiles on wgmma (sm_90a) or on mma.sync (sm_80+), their backward deterministic or
// adding dQ atomically, or the general kernels.
enum class Kernels { TilesWarpgroup, TilesMmaSync, TilesWarpgroupAtomic, TilesMmaSyncAtomic, General };
bool on_warpgroup(Kernels k) { return k == Kernels::TilesWarpgroup || k == Kernels::TilesWarpgroupAtomic; }
bool deterministic(Kernels k) { return k != Kernels::TilesWarpgroupAtomic && k != Kernels::TilesMmaSyncAtomic; }

struct Outputs {
  std::vector<float> out, lse, dqkv;
};

struct Problem {
  DType dtype;
  int64_t B, T, NH, HS;
  AttentionMask mask;
  HostTensor qkv, dout, key_mask;

  int64_t C() const { return NH * HS; }
  bool causal() const { return mask != AttentionMask::KeyPadding; }
  const int32_t* mask_pointer() const {
    return mask == AttentionMask::Causal ? nullptr : key_mask.as<int32_t>();
  }
};

Problem make_problem(DType dtype, int64_t HS, AttentionMask mask) {
  constexpr int64_t B = 2, T = 150, NH = 2;
  const int64_t C = NH * HS;
  Rng rng(31);
  std::vector<int32_t> keep(static_cast<size_t>(B * T), 1);
  for (int64_t i = 0; i < B * T; i += 7)
    keep[static_cast<size_t>(i)] = 0;  // padding inside every tile
  keep[0] = 0;                         // with causal: query 0 of batch 0 sees no key at all
  return Problem{
      dtype,
      B,
      T,
      NH,
      HS,
      mask,
      HostTensor(dtype, {B, T, 3 * C}, random_floats(static_cast<size_t>(B * T * 3 * C), rng)),
      HostTensor(dtype, {B, T, C}, random_floats(static_cast<size_t>(B * T * C), rng)),
      HostTensor::ints({B, T}, keep)};
}

Outputs reference(const Problem& p) {
  CpuBackend cpu;
  const HostTensor out = HostTensor::poisoned(p.dtype, {p.B, p.T, p.C()});
  const HostTensor lse = HostTensor::poisoned(DType::F32, {p.B * p.NH * p.T});
  const HostTensor dqkv = HostTensor::poisoned(p.dtype, {p.B, p.T, 3 * p.C()});
  const Tensor mask = p.mask == AttentionMask::Causal ? Tensor{} : p.key_mask.view();
  const int NH = static_cast<int>(p.NH);
  cpu.attention_forward({out.view(), lse.view(), p.qkv.view(), mask, NH, p.mask});
  cpu.attention_backward(
      {dqkv.view(), p.dout.view(), p.qkv.view(), out.view(), lse.view(), mask, NH, p.mask});
  return {out.floats(), lse.floats(), dqkv.floats()};
}

Outputs emulated(const Problem& p, Kernels kernels) {
  const HostTensor out = HostTensor::poisoned(p.dtype, {p.B, p.T, p.C()});
  const HostTensor lse = HostTensor::poisoned(DType::F32, {p.B * p.NH * p.T});
  const HostTensor dqkv = HostTensor::poisoned(p.dtype, {p.B, p.T, 3 * p.C()});
  const int64_t scratch_floats =  // D, and dQ's sums where the backward adds them atomically
      static_cast<int64_t>(attention_scratch_bytes(p.B, p.NH, p.T, p.dtype, true, deterministic(kernels) ? 0 : p.C())) /
      4;
  const HostTensor scratch = HostTensor::poisoned(DType::F32, {scratch_floats});
  const int kind = element_kind(p.dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.HS));
  const bool tiles = kernels != Kernels::General;

  EXPECT_TRUE(launched(
      tiles ? cuda::flash_attention_forward(out.data(), lse.as<float>(), p.qkv.data(), p.mask_pointer(), kind,
                                            p.B, p.T, p.NH, p.HS, p.causal(), scale, on_warpgroup(kernels))
            : cuda::general_attention_forward(out.data(), lse.as<float>(), p.qkv.data(), p.mask_pointer(),
                                              kind, p.B, p.T, p.NH, p.HS, p.causal(), scale)));
  EXPECT_TRUE(launched(
      tiles ? cuda::flash_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(), lse.as<float>(),
                                             p.mask_pointer(), kind, p.B, p.T, p.NH, p.HS, p.causal(), scale,
                                             scratch.data(), on_warpgroup(kernels), deterministic(kernels))
            : cuda::general_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(),
                                               lse.as<float>(), p.mask_pointer(), kind, p.B, p.T, p.NH, p.HS,
                                               p.causal(), scale, scratch.data())));
  for (const HostTensor* tensor : {&out, &lse, &dqkv, &scratch})
    EXPECT_TRUE(tensor->guard_intact()) << "a kernel wrote past one of its outputs";
  return {out.floats(), lse.floats(), dqkv.floats()};
}

using Case = std::tuple<Kernels, DType, int64_t, AttentionMask>;

class EmulatedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(EmulatedAttention, MatchesTheCpuAcrossTiles) {
  const auto [kernels, dtype, HS, mask] = GetParam();
  const Problem problem = make_problem(dtype, HS, mask);
  const Outputs expected = reference(problem);
  const Outputs actual = emulated(problem, kernels);
  const double bound = dtype == DType::BF16 ? 1e-2 : 2e-3;
  EXPECT_LT(normalized_error(actual.out, expected.out), bound);
  EXPECT_LT(normalized_error_with_infinities(actual.lse, expected.lse), bound);
  EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2 * bound);
}

// With the block's threads run highest first instead of lowest first (cuda_emulator::Schedule),
// code that lacks a barrier gives other answers; with every barrier in place the bits agree.
class EmulatedAttentionSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(EmulatedAttentionSchedule, DoesNotDependOnTheOrderThreadsRun) {
  const auto [kernels, dtype, HS, mask] = GetParam();
  const Problem problem = make_problem(dtype, HS, mask);
  const Outputs lowest_first = emulated(problem, kernels);
  cuda_emulator::set_schedule(cuda_emulator::Schedule::Reverse);
  const Outputs highest_first = emulated(problem, kernels);
  cuda_emulator::set_schedule(cuda_emulator::Schedule::Forward);
  EXPECT_EQ(lowest_first.out, highest_first.out);
  EXPECT_EQ(lowest_first.lse, highest_first.lse);
  EXPECT_EQ(lowest_first.dqkv, highest_first.dqkv);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [kernels, dtype, HS, mask] = info.param;
  const char* names[] = {"tiles_wgmma_", "tiles_mma_sync_", "tiles_wgmma_atomic_dq_", "tiles_mma_sync_atomic_dq_",
                         "general_"};
  return std::string(names[static_cast<int>(kernels)]) +
         std::string(dtype_name(dtype)) + "_HS" + std::to_string(HS) + "_" +
         (mask == AttentionMask::Causal       ? "causal"
          : mask == AttentionMask::KeyPadding ? "padding"
                                              : "causal_padding");
}

const auto kMasks = ::testing::Values(AttentionMask::Causal, AttentionMask::KeyPadding,
                                      AttentionMask::CausalKeyPadding);
INSTANTIATE_TEST_SUITE_P(General, EmulatedAttention,
                         ::testing::Combine(::testing::Values(Kernels::General),
                                            ::testing::Values(DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 4), kMasks),
                         case_name);
// The tensor-core kernels on mma.sync, which the back-end-level tests do not run on the emulator's
// sm_90a (both storage types, both tile widths, every mask).
INSTANTIATE_TEST_SUITE_P(TilesMmaSync, EmulatedAttention,
                         ::testing::Combine(::testing::Values(Kernels::TilesMmaSync),
                                            ::testing::Values(DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 80), kMasks),
                         case_name);

// The backward that adds dQ atomically, on wgmma and on mma.sync (the back-end-level tests run it on
// wgmma only), every mask and tile width.
INSTANTIATE_TEST_SUITE_P(TilesAtomicQueryGradient, EmulatedAttention,
                         ::testing::Combine(::testing::Values(Kernels::TilesWarpgroupAtomic,
                                                              Kernels::TilesMmaSyncAtomic),
                                            ::testing::Values(DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 80), kMasks),
                         case_name);

// Both masks at once; full tiles, a zero-padded tile, and one head size per lane width of the
// general kernels (up to 64, 128 and 256 channels).
INSTANTIATE_TEST_SUITE_P(Tiles, EmulatedAttentionSchedule,
                         ::testing::Combine(::testing::Values(Kernels::TilesWarpgroup, Kernels::TilesMmaSync,
                                                              Kernels::TilesWarpgroupAtomic,
                                                              Kernels::TilesMmaSyncAtomic),
                                            ::testing::Values(DType::BF16),
                                            ::testing::Values(64, 128, 80),
                                            ::testing::Values(AttentionMask::CausalKeyPadding)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(General, EmulatedAttentionSchedule,
                         ::testing::Combine(::testing::Values(Kernels::General),
                                            ::testing::Values(DType::BF16),
                                            ::testing::Values(20, 128, 256),
                                            ::testing::Values(AttentionMask::CausalKeyPadding)),
                         case_name);

}  // namespace
}  // namespace kiln::testing
