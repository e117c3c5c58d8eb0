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
// Attention dropout (ops.h, AttentionDropout) likewise on every kernel family, at two rates and an
// odd T too (a pair of keys whose Philox words straddle two blocks), plus its mask itself read back
// exactly (DropoutMaskReadBack), and the back-end's choice of path with dropout (CudaBackend
// attention with dropout takes the tiles where they apply, never cuDNN).
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <string>
#include <tuple>

#include "host_tensor.h"
#include "kiln/backend/attention_workspace.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cuda/flash_attention.h"
#include "kiln/backend/cuda/general_attention.h"
#include "kiln/backend/dropout_mask.h"
#include "kiln/backend/registry.h"
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

Problem make_problem(DType dtype, int64_t HS, AttentionMask mask, int64_t T = 150) {
  constexpr int64_t B = 2, NH = 2;
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

// With `dropout` (probability 0: none), attention dropout on both passes.
Outputs reference(const Problem& p, const AttentionDropout& dropout = {}) {
  CpuBackend cpu;
  const HostTensor out = HostTensor::poisoned(p.dtype, {p.B, p.T, p.C()});
  const HostTensor lse = HostTensor::poisoned(DType::F32, {p.B * p.NH * p.T});
  const HostTensor dqkv = HostTensor::poisoned(p.dtype, {p.B, p.T, 3 * p.C()});
  const Tensor mask = p.mask == AttentionMask::Causal ? Tensor{} : p.key_mask.view();
  const int NH = static_cast<int>(p.NH);
  AttentionForward forward{out.view(), lse.view(), p.qkv.view(), mask, NH, p.mask};
  forward.dropout = dropout;
  cpu.attention_forward(forward);
  AttentionBackward backward{dqkv.view(), p.dout.view(), p.qkv.view(), out.view(), lse.view(), mask, NH, p.mask};
  backward.dropout = dropout;
  cpu.attention_backward(backward);
  return {out.floats(), lse.floats(), dqkv.floats()};
}

Outputs emulated(const Problem& p, Kernels kernels, const DropoutMask& dropout = {}) {
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
                                            p.B, p.T, p.NH, p.HS, p.causal(), scale, on_warpgroup(kernels), nullptr,
                                            dropout)
            : cuda::general_attention_forward(out.data(), lse.as<float>(), p.qkv.data(), p.mask_pointer(),
                                              kind, p.B, p.T, p.NH, p.HS, p.causal(), scale, dropout)));
  EXPECT_TRUE(launched(
      tiles ? cuda::flash_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(), lse.as<float>(),
                                             p.mask_pointer(), kind, p.B, p.T, p.NH, p.HS, p.causal(), scale,
                                             scratch.data(), on_warpgroup(kernels), deterministic(kernels), nullptr,
                                             dropout)
            : cuda::general_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), out.data(),
                                               lse.as<float>(), p.mask_pointer(), kind, p.B, p.T, p.NH, p.HS,
                                               p.causal(), scale, scratch.data(), dropout)));
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

// ---- attention dropout ---------------------------------------------------------------------------
constexpr uint64_t kDropoutSeed = 0x5eedull, kDropoutStream = 0x57ea11ull;

// Kernels, storage type, head size, mask, dropout probability, T.
using DropoutCase = std::tuple<Kernels, DType, int64_t, AttentionMask, float, int64_t>;

class EmulatedAttentionDropout : public ::testing::TestWithParam<DropoutCase> {};

// The same comparison as MatchesTheCpuAcrossTiles with the CPU's dropout under the same (seed,
// stream): the kernels must drop what it drops (and keep m, l and lse undropped, scale the rest).
TEST_P(EmulatedAttentionDropout, MatchesTheCpuAcrossTiles) {
  const auto [kernels, dtype, HS, mask, probability, T] = GetParam();
  const Problem problem = make_problem(dtype, HS, mask, T);
  const AttentionDropout dropout{probability, kDropoutSeed, kDropoutStream};
  const Outputs expected = reference(problem, dropout);
  const Outputs actual = emulated(problem, kernels, dropout_mask(probability, kDropoutSeed, kDropoutStream));
  const double bound = dtype == DType::BF16 ? 1e-2 : 2e-3;
  EXPECT_LT(normalized_error(actual.out, expected.out), bound);
  EXPECT_LT(normalized_error_with_infinities(actual.lse, expected.lse), bound);
  EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2 * bound);
  // The comparison can fail: kernels that ignored the mask would miss by far more than the bounds.
  const Outputs undropped = reference(problem);
  EXPECT_GT(normalized_error(undropped.out, expected.out), 10 * bound);
  EXPECT_GT(normalized_error(undropped.dqkv, expected.dqkv), 10 * bound);
}

std::string dropout_case_name(const ::testing::TestParamInfo<DropoutCase>& info) {
  const auto [kernels, dtype, HS, mask, probability, T] = info.param;
  return case_name(::testing::TestParamInfo<Case>(Case{kernels, dtype, HS, mask}, info.index)) + "_p" +
         std::to_string(static_cast<int>(probability * 100 + 0.5f)) + "_T" + std::to_string(T);
}

const auto kDropoutRates = ::testing::Values(0.1f, 0.5f);
// Every tile variant's forward and deterministic backward on both storage types, both tile widths and
// a zero-padded head, every mask, at two rates; T = 150 (even: a lane's pairs of keys share a Philox
// block).
INSTANTIATE_TEST_SUITE_P(Tiles, EmulatedAttentionDropout,
                         ::testing::Combine(::testing::Values(Kernels::TilesMmaSync, Kernels::TilesWarpgroup),
                                            ::testing::Values(DType::BF16, DType::F16),
                                            ::testing::Values(64, 128, 80), kMasks, kDropoutRates,
                                            ::testing::Values(int64_t{150})),
                         dropout_case_name);
// The backward that adds dQ atomically (its dS^T, and so its dQ, from the key kernel's mask).
INSTANTIATE_TEST_SUITE_P(TilesAtomicQueryGradient, EmulatedAttentionDropout,
                         ::testing::Combine(::testing::Values(Kernels::TilesMmaSyncAtomic,
                                                              Kernels::TilesWarpgroupAtomic),
                                            ::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128),
                                            ::testing::Values(AttentionMask::CausalKeyPadding), kDropoutRates,
                                            ::testing::Values(int64_t{150})),
                         dropout_case_name);
// T odd: rows start at odd elements, so some pairs of keys straddle two Philox blocks. Also the
// general kernels, which the tiles must agree with.
INSTANTIATE_TEST_SUITE_P(OddLength, EmulatedAttentionDropout,
                         ::testing::Combine(::testing::Values(Kernels::TilesMmaSync, Kernels::TilesWarpgroup,
                                                              Kernels::TilesMmaSyncAtomic,
                                                              Kernels::TilesWarpgroupAtomic, Kernels::General),
                                            ::testing::Values(DType::BF16), ::testing::Values(64, 80),
                                            ::testing::Values(AttentionMask::Causal, AttentionMask::KeyPadding),
                                            ::testing::Values(0.5f), ::testing::Values(int64_t{131})),
                         dropout_case_name);

// The mask itself, element by element, on inputs that expose it exactly: q = 0 (every probability
// 1 / T), k and v the identity (k[t] = v[t] = e_t), T = 127 < HS = 128 across two key tiles (odd,
// so pairs straddle Philox blocks too), no key hidden. Then, with Z the factor and kept = Z != 0:
//   out[q][c] = Z(q, c) / T                         (the forward's mask);
//   with dout the identity, dv[k][c] = Z(c, k) / T   (the key kernel's, transposed);
//   with dout all ones, dq[q][k] = (Z(q, k) - D_q) scale / T, D_q = sum_k Z(q, k) / T, above
//   (1 - D_q) scale / T exactly where kept          (the query kernel's, or the key kernel's dS^T
//   when dQ is added atomically).
class DropoutMaskReadBack : public ::testing::TestWithParam<Kernels> {};

TEST_P(DropoutMaskReadBack, DropsExactlyTheElementsTheGeneralRuleDrops) {
  constexpr int64_t B = 2, T = 127, NH = 2, HS = 128, C = NH * HS;
  const DropoutMask mask = dropout_mask(0.5f, kDropoutSeed, kDropoutStream);
  const auto kept = [&](int64_t b, int64_t h, int64_t query, int64_t key) {
    return mask.factor(static_cast<uint64_t>(((b * NH + h) * T + query) * T + key)) != 0.0f;
  };
  std::vector<float> qkv(static_cast<size_t>(B * T * 3 * C), 0.0f), identity(static_cast<size_t>(B * T * C), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t row = b * T + t;
        qkv[static_cast<size_t>(row * 3 * C + C + h * HS + t)] = 1.0f;      // k
        qkv[static_cast<size_t>(row * 3 * C + 2 * C + h * HS + t)] = 1.0f;  // v
        identity[static_cast<size_t>(row * C + h * HS + t)] = 1.0f;
      }
  const auto problem = [&](const std::vector<float>& dout) {
    return Problem{DType::BF16,
                   B,
                   T,
                   NH,
                   HS,
                   AttentionMask::KeyPadding,
                   HostTensor(DType::BF16, {B, T, 3 * C}, qkv),
                   HostTensor(DType::BF16, {B, T, C}, dout),
                   HostTensor::ints({B, T}, std::vector<int32_t>(static_cast<size_t>(B * T), 1))};
  };
  const Outputs by_identity = emulated(problem(identity), GetParam(), mask);
  const Outputs by_ones = emulated(problem(std::vector<float>(static_cast<size_t>(B * T * C), 1.0f)), GetParam(), mask);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  int64_t kept_count = 0, out_wrong = 0, dv_wrong = 0, dq_wrong = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t q = 0; q < T; ++q) {
        double row_sum = 0.0;  // D_q: sum_k Z(q, k) / T
        for (int64_t k = 0; k < T; ++k) row_sum += kept(b, h, q, k) ? mask.scale / T : 0.0;
        for (int64_t k = 0; k < T; ++k) {
          const bool keep = kept(b, h, q, k);
          kept_count += keep;
          const auto at = [&](int64_t row, int64_t channel, int64_t width) {
            return static_cast<size_t>((b * T + row) * width + channel);
          };
          out_wrong += (by_identity.out[at(q, h * HS + k, C)] > 1.0f / T) != keep;
          dv_wrong += (by_identity.dqkv[at(k, 2 * C + h * HS + q, 3 * C)] > 1.0f / T) != keep;
          dq_wrong += (by_ones.dqkv[at(q, h * HS + k, 3 * C)] > (1.0 - row_sum) * scale / T) != keep;
        }
      }
  const int64_t elements = B * NH * T * T;
  EXPECT_GT(kept_count, elements / 3);  // about half
  EXPECT_LT(kept_count, 2 * elements / 3);
  EXPECT_EQ(out_wrong, 0) << "of " << elements;
  EXPECT_EQ(dv_wrong, 0) << "of " << elements;
  EXPECT_EQ(dq_wrong, 0) << "of " << elements;
}

std::string kernels_name(const ::testing::TestParamInfo<Kernels>& info) {
  const char* names[] = {"tiles_wgmma", "tiles_mma_sync", "tiles_wgmma_atomic_dq", "tiles_mma_sync_atomic_dq",
                         "general"};
  return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, DropoutMaskReadBack,
                         ::testing::Values(Kernels::TilesMmaSync, Kernels::TilesWarpgroup, Kernels::TilesMmaSyncAtomic,
                                           Kernels::TilesWarpgroupAtomic, Kernels::General),
                         kernels_name);

// The back-end's path with dropout (cuda_attention.cpp): the tiles take it where they apply (here:
// bf16, head 64, sm_90a), on mma.sync and on wgmma, and cuDNN never does (it cannot draw kiln's
// masks); out and dqkv as the CPU's with the same dropout. Counted by run_notes().
struct BackendAttention {
  std::vector<float> out, dqkv;
};

BackendAttention backend_attention(Backend& backend, AttentionMask mask, const AttentionDropout& dropout) {
  constexpr int64_t B = 2, T = 70, NH = 2, HS = 64, C = NH * HS;
  Rng rng(7);
  const std::vector<float> qkv_host = random_floats(static_cast<size_t>(B * T * 3 * C), rng);
  const std::vector<float> dout_host = random_floats(static_cast<size_t>(B * T * C), rng);
  std::vector<int32_t> keep(static_cast<size_t>(B * T), 1);
  keep[3] = keep[static_cast<size_t>(B * T - 1)] = 0;
  DeviceTensors t(backend, DType::BF16);
  const Tensor qkv = t.acts(qkv_host, {B, T, 3 * C});
  const Tensor out = t.poisoned_acts({B, T, C}), lse = t.poisoned({B * NH * T}), dqkv = t.poisoned_acts({B, T, 3 * C});
  const Tensor key_mask = mask == AttentionMask::Causal ? Tensor{} : t.ints(keep, {B, T});
  AttentionForward forward{out, lse, qkv, key_mask, static_cast<int>(NH), mask};
  forward.dropout = dropout;
  backend.attention_forward(forward);
  AttentionBackward backward{dqkv, t.acts(dout_host, {B, T, C}), qkv, out, lse, key_mask, static_cast<int>(NH), mask};
  backward.dropout = dropout;
  backend.attention_backward(backward);
  return {t.download(out), t.download(dqkv)};
}

TEST(EmulatedAttentionPaths, DropoutTakesTheTiles) {
  const AttentionDropout dropout{0.3f, kDropoutSeed, kDropoutStream};
  auto cpu = make_backend("cpu");
  for (const AttentionMask mask : {AttentionMask::Causal, AttentionMask::KeyPadding})
    for (const bool warpgroup : {false, true}) {
      SCOPED_TRACE(std::string(warpgroup ? "wgmma, " : "mma.sync, ") +
                   (mask == AttentionMask::Causal ? "causal" : "padding"));
      const BackendAttention expected = backend_attention(*cpu, mask, dropout);
      BackendOptions options;
      options.warpgroup_attention = warpgroup;
      auto gpu = make_backend("cuda", options);
      const BackendAttention actual = backend_attention(*gpu, mask, dropout);
      EXPECT_LT(normalized_error(actual.out, expected.out), 1e-2);
      EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2e-2);
      const std::string notes = gpu->run_notes();
      EXPECT_NE(notes.find(std::string("attention forward calls: 1 fused on tensor cores (") + (warpgroup ? "1" : "0") +
                           " on wgmma), 0 fused general, 0 materialised"),
                std::string::npos)
          << notes;
      EXPECT_NE(notes.find("backward calls on tensor cores: 1,"), std::string::npos) << notes;
    }
}

TEST(EmulatedAttentionPaths, CudnnLeavesDropoutToTheTiles) {
  BackendOptions with_cudnn;
  with_cudnn.cudnn_attention = true;
  const auto cudnn_calls = [](const Backend& backend) {
    const std::string notes = backend.run_notes();
    std::smatch calls;
    EXPECT_TRUE(std::regex_search(notes, calls, std::regex("attention forward calls on cuDNN [^:]*: ([0-9]+)")))
        << notes;
    return calls.size() > 1 ? calls[1].str() : std::string("?");
  };
  std::unique_ptr<Backend> without_dropout, with_dropout;
  try {
    without_dropout = make_backend("cuda", with_cudnn);
    with_dropout = make_backend("cuda", with_cudnn);
  } catch (const std::exception& error) {
    GTEST_SKIP() << error.what();
  }
  backend_attention(*without_dropout, AttentionMask::Causal, {});
  EXPECT_EQ(cudnn_calls(*without_dropout), "1");  // without dropout cuDNN takes this call
  const AttentionDropout dropout{0.3f, kDropoutSeed, kDropoutStream};
  const BackendAttention expected = backend_attention(*make_backend("cpu"), AttentionMask::Causal, dropout);
  const BackendAttention actual = backend_attention(*with_dropout, AttentionMask::Causal, dropout);
  EXPECT_EQ(cudnn_calls(*with_dropout), "0");
  const std::string notes = with_dropout->run_notes();
  EXPECT_NE(notes.find("attention forward calls: 1 fused on tensor cores"), std::string::npos) << notes;
  EXPECT_LT(normalized_error(actual.out, expected.out), 1e-2);
  EXPECT_LT(normalized_error(actual.dqkv, expected.dqkv), 2e-2);
}

}  // namespace
}  // namespace kiln::testing
