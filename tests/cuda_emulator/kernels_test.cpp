// The CUDA back-end's own kernels other than attention (kernels.h) on the CPU emulator
// (cuda_emulator.h), against the CPU back-end's ops on the same inputs, in every storage dtype:
// embedding, LayerNorm (with the residual; cast to fp8; the backward over runs of rows and slices
// of columns), GELU, fill, convert, softmax cross-entropy, AdamW and the sum of squares. Shapes are
// picked to cross the kernels' edges: rows that do not fill a block of eight, more than one chunk
// of column sums (M > 1024), rows wider than a LayerNorm backward's slice, token runs longer than a
// block's 256 staged rows, vocabularies with padding columns. Outputs start as NaN; accumulating
// outputs start random. Bounds as the CUDA op table's (ops_test.cpp): normalised error 1e-5 in
// fp32, 1e-2 in bf16, 2e-3 in fp16.
#include "kiln/backend/cuda/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "host_tensor.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/layernorm_workspace.h"
#include "kiln/core/rng.h"

namespace kiln::testing {
namespace {

double bound(DType dtype) {
  return dtype == DType::F32 ? 1e-5 : dtype == DType::BF16 ? 1e-2 : 2e-3;
}

std::vector<float> randoms(int64_t count, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  return random_floats(static_cast<size_t>(count), rng, scale);
}

// Each case in every dtype, and with the threads of a block run lowest first and highest first
// (cuda_emulator::Schedule): a missing barrier tends to give different answers in one of the two.
class EmulatedKernels
    : public ::testing::TestWithParam<std::tuple<DType, cuda_emulator::Schedule>> {
 protected:
  void SetUp() override { cuda_emulator::set_schedule(std::get<1>(GetParam())); }
  void TearDown() override { cuda_emulator::set_schedule(cuda_emulator::Schedule::Forward); }
  DType dtype() const { return std::get<0>(GetParam()); }
  int kind() const { return element_kind(dtype()); }
  HostTensor acts(Shape shape, uint64_t seed, float scale = 1.0f) const {
    return HostTensor(dtype(), shape, randoms(shape.numel(), seed, scale));
  }
  HostTensor poisoned(Shape shape) const { return HostTensor::poisoned(dtype(), shape); }
  static HostTensor floats(Shape shape, uint64_t seed) {
    return HostTensor(DType::F32, shape, randoms(shape.numel(), seed));
  }
  // A copy of `tensor` (same dtype and values), for an output both sides accumulate into.
  static HostTensor copy_of(const HostTensor& tensor, DType dtype) {
    return HostTensor(dtype, tensor.view().shape, tensor.floats());
  }
  void layernorm_backward_matches_the_cpu(int64_t M, int64_t C, GradStore din_store, GradStore param_store);
  void layernorm_backward_cast_is_the_cast_of_its_gradient(int64_t M, int64_t C);
  void softmax_cross_entropy_matches_the_cpu(int64_t M, int64_t V, int64_t Vp);
  CpuBackend cpu;
};

// What a gradient the kernel stores as `store` holds before it: `seed` where it adds (the CPU
// reference starts from the same), NaN where it writes (the reference zeroes its own copy).
std::vector<float> held_before(GradStore store, const std::vector<float>& seed) {
  return store == GradStore::Add ? seed : std::vector<float>(seed.size(), NAN);
}

constexpr GradStore kStores[] = {GradStore::Add, GradStore::Write};
const char* name_of(GradStore store) { return store == GradStore::Add ? "add: " : "write: "; }

void expect_close(const HostTensor& actual, const HostTensor& expected, double limit,
                  const std::string& what) {
  EXPECT_LT(normalized_error(actual.floats(), expected.floats()), limit) << what;
  EXPECT_TRUE(actual.guard_intact()) << what << ": written past its end";
}

// Token runs of every kind the backward's two kernels split: runs of 300 (from the first sorted
// position, across five multiples of 64), 64 (the longest a warp takes) and 65 (the shortest a
// block takes), 200 ending at the last position, and the rest ones and twos; rows narrower than a
// 16-byte pack allows (20 columns), a group of columns (24) and more than one (1100).
TEST_P(EmulatedKernels, EmbeddingForwardAndBackward) {
  constexpr int64_t B = 3, T = 400, Vp = 300, maxT = 410;
  std::vector<int32_t> token_values;
  for (const auto& [token, count] : {std::pair<int32_t, int>{0, 300}, {1, 64}, {2, 65}, {Vp - 1, 200}})
    token_values.insert(token_values.end(), static_cast<size_t>(count), token);
  Rng rng(3);
  while (token_values.size() < static_cast<size_t>(B * T))
    token_values.push_back(3 + static_cast<int32_t>(rng.below(Vp - 4)));
  for (size_t i = token_values.size() - 1; i > 0; --i) std::swap(token_values[i], token_values[rng.below(i + 1)]);
  const HostTensor tokens = HostTensor::ints({B, T}, token_values);
  for (const int64_t C : {20, 24, 1100}) {
    const std::string columns = fmt::format("C {}: ", C);
    const HostTensor wte = acts({Vp, C}, 1), wpe = acts({maxT, C}, 2), dout = acts({B, T, C}, 4);
    const HostTensor out = poisoned({B, T, C}), expected_out = poisoned({B, T, C});
    cpu.embedding_forward({expected_out.view(), tokens.view(), wte.view(), wpe.view()});
    ASSERT_TRUE(launched(cuda::embedding_forward(out.data(), tokens.as<int32_t>(), wte.data(), wpe.data(), kind(), B,
                                                 T, C)));
    expect_close(out, expected_out, bound(dtype()), columns + "out");

    // dwte always adds; dwpe adds, or writes all its rows (those past T zero).
    for (const GradStore store : kStores) {
      const HostTensor expected_dwte = floats({Vp, C}, 5), expected_dwpe = floats({maxT, C}, 6);
      const HostTensor dwte = copy_of(expected_dwte, DType::F32),
                       dwpe(DType::F32, {maxT, C}, held_before(store, expected_dwpe.floats()));
      cpu.embedding_backward({expected_dwte.view(), expected_dwpe.view(), dout.view(), tokens.view(), store});
      const size_t workspace_bytes = cuda::embedding_backward_workspace_bytes(B * T);
      const HostTensor workspace = HostTensor::poisoned(DType::F32, {static_cast<int64_t>(workspace_bytes / 4 + 1)});
      ASSERT_TRUE(launched(cuda::embedding_backward(dwte.as<float>(), dwpe.as<float>(), dout.data(), kind(),
                                                    tokens.as<int32_t>(), B, T, C, maxT, store == GradStore::Write,
                                                    workspace.data(), workspace_bytes)));
      expect_close(dwte, expected_dwte, 1e-5, columns + name_of(store) + "dwte");
      expect_close(dwpe, expected_dwpe, 1e-5, columns + name_of(store) + "dwpe");
    }
  }
}

TEST_P(EmulatedKernels, LayerNormForward) {
  constexpr int64_t M = 37, C = 200;  // rows: four blocks of eight and a partial one
  const HostTensor in = acts({M, C}, 1, 2.0f), weight = acts({C}, 3), bias = acts({C}, 4);
  const HostTensor out = poisoned({M, C}), expected_out = poisoned({M, C});
  const HostTensor mean = HostTensor::poisoned(DType::F32, {M}), expected_mean = HostTensor::poisoned(DType::F32, {M});
  const HostTensor rstd = HostTensor::poisoned(DType::F32, {M}), expected_rstd = HostTensor::poisoned(DType::F32, {M});
  cpu.layernorm_forward(
      {expected_out.view(), expected_mean.view(), expected_rstd.view(), in.view(), weight.view(), bias.view()});
  ASSERT_TRUE(launched(cuda::layernorm_forward(out.data(), mean.as<float>(), rstd.as<float>(), in.data(),
                                               weight.data(), bias.data(), kind(), M, C, 1e-5f)));
  expect_close(out, expected_out, bound(dtype()), "out");
  expect_close(mean, expected_mean, 1e-5, "mean");
  expect_close(rstd, expected_rstd, 1e-5, "rstd");
  EXPECT_TRUE(out.guard_intact()) << "written past its end";
}

// The LayerNorm that casts its output against the plain one and the cast kernel, in the same bits,
// under both thread schedules: 48 rows (a block of 32 and a half); 272 and 768 columns, rows held
// in registers (2 and 3 packs of 8 a lane in 16-bit types; in fp32 272 in 3 packs of 4, 768 in
// tiles), and 1296, wider than registers hold in any dtype (tiles of 128 columns, the last partial).
TEST_P(EmulatedKernels, LayerNormCastToFp8IsTheCastOfItsOutput) {
  constexpr int64_t M = 48;
  for (const int64_t C : {272, 768, 1296}) {
    SCOPED_TRACE(fmt::format("C {}", C));
    const HostTensor in = acts({M, C}, 1, 2.0f), weight = acts({C}, 3), bias = acts({C}, 4),
                     scale = HostTensor(DType::F32, {1}, {8.0f});
    struct Outputs {
      HostTensor mean, rstd, codes, codes_t, amax;
    };
    const auto fresh = [&] {
      return Outputs{HostTensor::poisoned(DType::F32, {M}), HostTensor::poisoned(DType::F32, {M}),
                     HostTensor::poisoned(DType::F8E4M3, {M, C}), HostTensor::poisoned(DType::F8E4M3, {C, M}),
                     HostTensor(DType::F32, {1}, {0.0f})};
    };
    const Outputs plain = fresh(), cast = fresh();
    const HostTensor out = poisoned({M, C});
    ASSERT_TRUE(launched(cuda::layernorm_forward(out.data(), plain.mean.as<float>(), plain.rstd.as<float>(),
                                                 in.data(), weight.data(), bias.data(), kind(), M, C, 1e-5f)));
    ASSERT_TRUE(launched(cuda::cast_fp8(out.data(), kind(), M, C, scale.as<float>(), plain.amax.as<float>(), true,
                                        plain.codes.as<uint8_t>(), plain.codes_t.as<uint8_t>(), nullptr)));
    ASSERT_TRUE(launched(cuda::layernorm_forward_fp8(cast.codes.as<uint8_t>(), cast.codes_t.as<uint8_t>(),
                                                     cast.mean.as<float>(), cast.rstd.as<float>(), in.data(),
                                                     weight.data(), bias.data(), kind(), M, C, 1e-5f,
                                                     scale.as<float>(), cast.amax.as<float>())));
    EXPECT_EQ(cast.codes.floats(), plain.codes.floats()) << "codes";
    EXPECT_EQ(cast.codes_t.floats(), plain.codes_t.floats()) << "transposed codes";
    EXPECT_EQ(cast.amax.floats(), plain.amax.floats()) << "amax";
    EXPECT_EQ(cast.mean.floats(), plain.mean.floats()) << "mean";
    EXPECT_EQ(cast.rstd.floats(), plain.rstd.floats()) << "rstd";
    for (const HostTensor* written : {&cast.codes, &cast.codes_t})
      EXPECT_TRUE(written->guard_intact()) << "written past its end";
  }
}

// The LayerNorm backward that casts its input gradient against the plain backward followed by the
// cast with column sums, in the same bits: din (added to what it held), its codes in both layouts,
// amax and the product's bias gradient; the LayerNorm's own parameter gradients summed in another
// order (tiles of 32 rows, not runs), so close. Shapes as the forward's above, under both thread
// schedules.
TEST_P(EmulatedKernels, LayerNormBackwardCastToFp8IsTheCastOfItsInputGradient) {
  for (const int64_t C : {272, 768, 1296}) {
    SCOPED_TRACE(fmt::format("C {}", C));
    layernorm_backward_cast_is_the_cast_of_its_gradient(48, C);
  }
}

void EmulatedKernels::layernorm_backward_cast_is_the_cast_of_its_gradient(int64_t M, int64_t C) {
  const HostTensor in = acts({M, C}, 1, 2.0f), weight = acts({C}, 2), bias = acts({C}, 3), dout = acts({M, C}, 4),
                   din_before = acts({M, C}, 5), scale = HostTensor(DType::F32, {1}, {16.0f});
  const HostTensor mean = HostTensor::poisoned(DType::F32, {M}), rstd = HostTensor::poisoned(DType::F32, {M});
  const HostTensor normed = poisoned({M, C});
  cpu.layernorm_forward({normed.view(), mean.view(), rstd.view(), in.view(), weight.view(), bias.view()});
  struct Outputs {
    HostTensor din, dweight, dbias, product_dbias, codes, codes_t, amax;
  };
  const auto fresh = [&] {
    return Outputs{copy_of(din_before, dtype()),
                   HostTensor(DType::F32, {C}, std::vector<float>(C, 0.0f)),
                   HostTensor(DType::F32, {C}, std::vector<float>(C, 0.0f)),
                   HostTensor(DType::F32, {C}, std::vector<float>(C, 0.0f)),
                   HostTensor::poisoned(DType::F8E5M2, {M, C}),
                   HostTensor::poisoned(DType::F8E5M2, {C, M}),
                   HostTensor(DType::F32, {1}, {0.0f})};
  };
  const Outputs plain = fresh(), cast = fresh();
  const size_t scratch = layernorm_backward_scratch_bytes(M, C, true);
  const HostTensor workspace = HostTensor::poisoned(DType::F32, {static_cast<int64_t>(scratch / 4)});
  ASSERT_TRUE(launched(cuda::layernorm_backward(plain.din.data(), plain.dweight.as<float>(),
                                                plain.dbias.as<float>(), dout.data(), in.data(), weight.data(),
                                                kind(), mean.as<float>(), rstd.as<float>(), M, C, false, false,
                                                workspace.data())));
  ASSERT_TRUE(launched(cuda::cast_fp8(plain.din.data(), kind(), M, C, scale.as<float>(), plain.amax.as<float>(),
                                      false, plain.codes.as<uint8_t>(), plain.codes_t.as<uint8_t>(),
                                      workspace.as<float>())));
  ASSERT_TRUE(launched(cuda::sum_column_partials(plain.product_dbias.as<float>(), workspace.as<float>(),
                                                 fp8_cast_tile_rows(M), C, false)));
  ASSERT_TRUE(launched(cuda::layernorm_backward_fp8(
      cast.din.data(), cast.dweight.as<float>(), cast.dbias.as<float>(), cast.product_dbias.as<float>(), dout.data(),
      in.data(), weight.data(), kind(), mean.as<float>(), rstd.as<float>(), M, C, false, false, scale.as<float>(),
      cast.amax.as<float>(), false, cast.codes.as<uint8_t>(), cast.codes_t.as<uint8_t>(), workspace.data())));
  EXPECT_EQ(cast.din.floats(), plain.din.floats()) << "din";
  EXPECT_EQ(cast.codes.floats(), plain.codes.floats()) << "codes";
  EXPECT_EQ(cast.codes_t.floats(), plain.codes_t.floats()) << "transposed codes";
  EXPECT_EQ(cast.amax.floats(), plain.amax.floats()) << "amax";
  EXPECT_EQ(cast.product_dbias.floats(), plain.product_dbias.floats()) << "the product's bias gradient";
  expect_close(cast.dweight, plain.dweight, 1e-5, "dweight");
  expect_close(cast.dbias, plain.dbias, 1e-5, "dbias");
  for (const HostTensor* written : {&cast.din, &cast.codes, &cast.codes_t})
    EXPECT_TRUE(written->guard_intact()) << "written past its end";
  EXPECT_TRUE(workspace.guard_intact()) << "partial sums written past layernorm_backward_scratch_bytes";
}

// LayerNorm backward on M x C rows against the CPU; then again with din one element further into a
// buffer, which takes the element-wise path: the parameter gradients must come out in the same bits
// (each column's order of addition, rows in turn, warps, runs, does not depend on the pack width).
// din and the parameter gradients are stored as din_store and param_store say (NaN before a write).
void EmulatedKernels::layernorm_backward_matches_the_cpu(int64_t M, int64_t C, GradStore din_store,
                                                         GradStore param_store) {
  SCOPED_TRACE(std::string("din ") + name_of(din_store) + "parameters " + name_of(param_store));
  const HostTensor in = acts({M, C}, 1, 2.0f), weight = acts({C}, 2), bias = acts({C}, 3),
                   dout = acts({M, C}, 4);
  const HostTensor mean = HostTensor::poisoned(DType::F32, {M}), rstd = HostTensor::poisoned(DType::F32, {M});
  const HostTensor normed = poisoned({M, C});
  cpu.layernorm_forward({normed.view(), mean.view(), rstd.view(), in.view(), weight.view(), bias.view()});

  const HostTensor expected_din = acts({M, C}, 5), expected_dweight = floats({C}, 6),
                   expected_dbias = floats({C}, 7);
  const std::vector<float> initial_din = expected_din.floats(), initial_dweight = expected_dweight.floats(),
                           initial_dbias = expected_dbias.floats();
  cpu.layernorm_backward({expected_din.view(), expected_dweight.view(), expected_dbias.view(), dout.view(),
                          in.view(), weight.view(), mean.view(), rstd.view(), param_store, din_store});
  const size_t workspace_bytes = layernorm_backward_scratch_bytes(M, C);
  const HostTensor workspace = HostTensor::poisoned(DType::F32, {static_cast<int64_t>(workspace_bytes / 4)});
  const auto run = [&](void* din, const HostTensor& dweight, const HostTensor& dbias) {
    return launched(cuda::layernorm_backward(din, dweight.as<float>(), dbias.as<float>(), dout.data(), in.data(),
                                             weight.data(), kind(), mean.as<float>(), rstd.as<float>(), M, C,
                                             din_store == GradStore::Write, param_store == GradStore::Write,
                                             workspace.data()));
  };
  const std::vector<float> din_before = held_before(din_store, initial_din),
                           dweight_before = held_before(param_store, initial_dweight),
                           dbias_before = held_before(param_store, initial_dbias);
  const HostTensor din(dtype(), {M, C}, din_before), dweight(DType::F32, {C}, dweight_before),
      dbias(DType::F32, {C}, dbias_before);
  ASSERT_TRUE(run(din.data(), dweight, dbias));
  expect_close(din, expected_din, 2 * bound(dtype()), "din");
  expect_close(dweight, expected_dweight, 1e-5, "dweight");
  expect_close(dbias, expected_dbias, 1e-5, "dbias");
  EXPECT_TRUE(workspace.guard_intact()) << "partial sums written past layernorm_backward_scratch_bytes";

  std::vector<float> shifted_din = din_before;
  shifted_din.insert(shifted_din.begin(), 0.0f);
  const HostTensor shifted(dtype(), {M * C + 1}, shifted_din), unpacked_dweight(DType::F32, {C}, dweight_before),
      unpacked_dbias(DType::F32, {C}, dbias_before);
  ASSERT_TRUE(run(static_cast<char*>(shifted.data()) + dtype_size(dtype()), unpacked_dweight, unpacked_dbias));
  EXPECT_EQ(unpacked_dweight.floats(), dweight.floats()) << "packed and element-wise dweight differ";
  EXPECT_EQ(unpacked_dbias.floats(), dbias.floats()) << "packed and element-wise dbias differ";
  std::vector<float> unpacked_din = shifted.floats();
  unpacked_din.erase(unpacked_din.begin());
  EXPECT_LT(normalized_error(unpacked_din, expected_din.floats()), 2 * bound(dtype())) << "element-wise din";
}

// 35 runs of rows, the last one short; 40 columns: a partial warp of packs. Each gradient added and
// written.
TEST_P(EmulatedKernels, LayerNormBackwardOverSeveralRuns) {
  layernorm_backward_matches_the_cpu(1100, 40, GradStore::Add, GradStore::Add);
  layernorm_backward_matches_the_cpu(1100, 40, GradStore::Write, GradStore::Add);
  layernorm_backward_matches_the_cpu(1100, 40, GradStore::Add, GradStore::Write);
}

// Rows wider than one slice of columns: slices of 2048, 2048 and 8; three runs of 24 rows, the last
// of 22, so one warp of a run has a row fewer.
TEST_P(EmulatedKernels, LayerNormBackwardOverSeveralSlices) {
  layernorm_backward_matches_the_cpu(70, 4104, GradStore::Add, GradStore::Add);
  layernorm_backward_matches_the_cpu(70, 4104, GradStore::Write, GradStore::Write);
}

// The partial sums' last pass (column_sums_finish, bias.cu) over 600 chunks of 40 columns: more
// chunks than its 16 warps load 16 at a time, so a thread batches its loads three times, the last
// batch partial. Each column must be the sum in the documented order, to the bit: warp k adds
// chunks k, k + 16, ... in turn, then the warps' sums are added in warp order; added and written.
TEST_P(EmulatedKernels, ColumnPartialsAddInTheirDocumentedOrder) {
  if (dtype() != DType::F32) GTEST_SKIP() << "partial sums are floats in every dtype: run once";
  constexpr int64_t kChunks = 600, N = 40, kWarps = 16;
  const std::vector<float> partials = randoms(kChunks * N, 9), before = randoms(N, 10);
  std::vector<float> in_order(N);
  for (int64_t n = 0; n < N; ++n) {
    float total = 0.0f;
    for (int64_t k = 0; k < kWarps; ++k) {
      float warp = 0.0f;
      for (int64_t chunk = k; chunk < kChunks; chunk += kWarps) warp += partials[chunk * N + n];
      total = k == 0 ? warp : total + warp;
    }
    in_order[n] = total;
  }
  const HostTensor device_partials(DType::F32, {kChunks, N}, partials);
  for (const GradStore store : kStores) {
    SCOPED_TRACE(name_of(store));
    const HostTensor sums(DType::F32, {N}, held_before(store, before));
    ASSERT_TRUE(launched(cuda::sum_column_partials(sums.as<float>(), device_partials.as<float>(), kChunks, N,
                                                   store == GradStore::Write)));
    std::vector<float> expected = in_order;
    if (store == GradStore::Add)
      for (int64_t n = 0; n < N; ++n) expected[n] = before[n] + in_order[n];
    EXPECT_EQ(sums.floats(), expected);
  }
}

// N = 72 takes 16-byte packs in every dtype; the same rows one element further into a buffer are
// misaligned for packs and take the element-wise path, which must give the same bits (the order of
// addition per column does not depend on the pack width). The sums added and written.
TEST_P(EmulatedKernels, BiasGradientColumnSums) {
  constexpr int64_t M = 1100, N = 72;
  const HostTensor in = acts({M, N}, 1), weight = acts({N, 3}, 2), bias = floats({N}, 3);
  for (const GradStore store : kStores) {
    SCOPED_TRACE(name_of(store));
    const HostTensor expected_dbias = floats({N}, 4);
    const std::vector<float> initial = held_before(store, expected_dbias.floats());
    const HostTensor sums(DType::F32, {N}, initial);
    // The CPU reference's bias gradient: matmul_backward's dbias is the column sums of dout.
    const HostTensor din = poisoned({M, 3}),
                     dweight = HostTensor(DType::F32, {N, 3}, std::vector<float>(N * 3, 0.0f));
    const HostTensor x = acts({M, 3}, 5);
    MatmulBackward reference{din.view(), dweight.view(), expected_dbias.view(), in.view(), x.view(),
                             weight.view(), WeightLayout::OutIn};
    reference.param_store = store;
    cpu.matmul_backward(reference);
    const size_t workspace_bytes = cuda::column_sums_workspace_bytes(M, N);
    const HostTensor workspace =
        HostTensor::poisoned(DType::F32, {static_cast<int64_t>(workspace_bytes / 4 + 1)});
    const bool write = store == GradStore::Write;
    ASSERT_TRUE(launched(cuda::sum_columns(sums.as<float>(), in.data(), kind(), M, N, workspace.data(), write)));
    expect_close(sums, expected_dbias, 1e-5, "column sums");

    std::vector<float> shifted_values = in.floats();
    shifted_values.insert(shifted_values.begin(), 0.0f);
    const HostTensor shifted(dtype(), {M * N + 1}, shifted_values);
    const HostTensor unpacked_sums(DType::F32, {N}, initial);
    const void* misaligned = static_cast<const char*>(shifted.data()) + dtype_size(dtype());
    ASSERT_TRUE(
        launched(cuda::sum_columns(unpacked_sums.as<float>(), misaligned, kind(), M, N, workspace.data(), write)));
    EXPECT_EQ(unpacked_sums.floats(), sums.floats()) << "packed and element-wise column sums differ";
  }
}

TEST_P(EmulatedKernels, GeluFillAndConvert) {
  constexpr int64_t count = 3000;  // blocks of 256 and a partial one
  const HostTensor in = acts({count}, 1, 3.0f), dout = acts({count}, 3);
  const HostTensor out = poisoned({count}), expected = poisoned({count});
  cpu.gelu_forward({expected.view(), in.view()});
  ASSERT_TRUE(launched(cuda::gelu_forward(out.data(), in.data(), kind(), count)));
  expect_close(out, expected, bound(dtype()), "gelu");

  cpu.gelu_backward({expected.view(), in.view(), dout.view()});
  ASSERT_TRUE(launched(cuda::gelu_backward(out.data(), in.data(), dout.data(), kind(), count)));
  expect_close(out, expected, bound(dtype()), "gelu backward");

  ASSERT_TRUE(launched(cuda::fill(out.data(), kind(), 0.375f, count)));
  EXPECT_EQ(out.floats(), std::vector<float>(count, 0.375f));

  for (const DType from : {DType::F32, DType::BF16, DType::F16}) {
    const HostTensor source(from, {count}, randoms(count, 7, 1e3f));
    const HostTensor converted = poisoned({count}), expected_converted = poisoned({count});
    cpu.convert({expected_converted.view(), source.view()});
    ASSERT_TRUE(launched(
        cuda::convert(converted.data(), kind(), source.data(), element_kind(from), count)));
    EXPECT_EQ(converted.floats(), expected_converted.floats())
        << "from " << dtype_name(from);  // rounding is exact
  }
}

// Rows of 1024 columns (less than one sweep of a 1024-thread block) and of GPT-2's padded
// vocabulary (50,304: several sweeps, a pair of packs in flight and a lone one at the row's end).
TEST_P(EmulatedKernels, SoftmaxCrossEntropyWithPaddingAndIgnoredRows) {
  softmax_cross_entropy_matches_the_cpu(37, 1000, 1024);
  softmax_cross_entropy_matches_the_cpu(5, 50257, 50304);
}

void EmulatedKernels::softmax_cross_entropy_matches_the_cpu(int64_t M, int64_t V, int64_t Vp) {
  std::vector<int32_t> target_values(static_cast<size_t>(M));
  Rng rng(5);
  for (int32_t& target : target_values) target = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  target_values[3] = -100;
  target_values[static_cast<size_t>(M) - 1] = static_cast<int32_t>(V - 1);  // the last real column
  const HostTensor targets = HostTensor::ints({M}, target_values);
  const float loss_scale = dtype() == DType::F16 ? 1024.0f : 0.5f;
  for (const bool write_grad : {false, true}) {
    const HostTensor logits = acts({M, Vp}, 1, 4.0f), expected_logits = copy_of(logits, dtype());
    const HostTensor losses = HostTensor::poisoned(DType::F32, {M}),
                     expected_losses = HostTensor::poisoned(DType::F32, {M});
    cpu.softmax_cross_entropy({expected_logits.view(), expected_losses.view(), targets.view(), V,
                               -100, loss_scale, write_grad});
    ASSERT_TRUE(launched(cuda::softmax_cross_entropy(logits.data(), kind(), losses.as<float>(),
                                                     targets.as<int32_t>(), M, V, Vp, -100,
                                                     loss_scale, write_grad)));
    const std::string what = fmt::format("V {}, {}", V, write_grad ? "with gradient: " : "losses only: ");
    expect_close(losses, expected_losses, 1e-5, what + "losses");
    expect_close(logits, expected_logits, bound(dtype()), what + "logits");
  }
}

// On a GPU that gives a block 99 KB of shared memory and an SM 100 KB (as some do), the kernels
// that would ask for more take their other forms, with the same results: the fp8 LayerNorm
// backward at 1024 columns (131 KB in the register form: the tile form) and the cross-entropy over
// GPT-2's vocabulary (two staged rows an SM do not fit: the plain form).
TEST_P(EmulatedKernels, ASmallerGpusSharedMemoryTakesTheOtherForms) {
  struct Limits {
    Limits() { cuda_emulator::set_shared_memory_limits(99 * 1024, 100 * 1024); }
    ~Limits() {
      cuda_emulator::set_shared_memory_limits(cuda_emulator::kH100SharedBytesPerBlock,
                                              cuda_emulator::kH100SharedBytesPerSm);
    }
  } smaller_gpu;
  layernorm_backward_cast_is_the_cast_of_its_gradient(48, 1024);
  softmax_cross_entropy_matches_the_cpu(5, 50257, 50304);
}

// Rows of 2^30 columns or more are refused before anything is read (the kernel's column indices
// are ints, stepping past Vp by up to a sweep of the block).
TEST_P(EmulatedKernels, SoftmaxCrossEntropyRefusesRowsTooLongForItsIndices) {
  constexpr int64_t kTooLong = int64_t{1} << 30;
  EXPECT_FALSE(launched(cuda::softmax_cross_entropy(nullptr, kind(), nullptr, nullptr, 1, kTooLong - 8, kTooLong,
                                                    -100, 1.0f, true)));
}

// AdamW over ranges cut to cross every edge of the kernel's: about 230 ranges (four launches of at
// most 64), of 0 to 23 elements and one of 1000, starting anywhere within a 4-element pack, with
// gaps between some that both sides leave as they were; once on 16-byte aligned buffers (packs of
// four) and once on buffers one element past that (one element at a time).
TEST_P(EmulatedKernels, AdamwOverRangesCrossingEveryEdge) {
  constexpr int64_t P = 4000;
  std::vector<AdamwSegment> segments;
  for (int64_t k = 0, offset = 0;; ++k) {
    offset += k % 5 == 0 ? 2 : 0;  // a gap
    const int64_t count = k == 40 ? 1000 : k % 17 == 16 ? 0 : 1 + k * 7 % 23;
    if (offset + count > P - 1) break;
    segments.push_back({offset, count, k % 3 == 0 ? 0.0f : 0.1f});
    offset += count;
  }
  ASSERT_GT(segments.size(), 3u * 64);
  std::vector<cuda::AdamwRange> ranges;
  for (const AdamwSegment& segment : segments) ranges.push_back({segment.offset, segment.count, segment.weight_decay});
  std::vector<float> squares = randoms(P, 4);
  for (float& value : squares) value *= value;
  const HostTensor master = floats({P}, 1), grad = floats({P}, 2), exp_avg = floats({P}, 3),
                   exp_avg_sq(DType::F32, {P}, squares), param = acts({P}, 5);
  for (const int64_t shift : {0, 1}) {
    const int64_t n = P - shift;
    const auto tail = [&](const HostTensor& whole) { return whole.view().slice(shift, n); };
    const HostTensor expected_master = copy_of(master, DType::F32), expected_m = copy_of(exp_avg, DType::F32),
                     expected_v = copy_of(exp_avg_sq, DType::F32), expected_param = copy_of(param, dtype());
    const HostTensor actual_master = copy_of(master, DType::F32), actual_m = copy_of(exp_avg, DType::F32),
                     actual_v = copy_of(exp_avg_sq, DType::F32), actual_param = copy_of(param, dtype());
    const AdamwStep step{tail(expected_master), tail(expected_param), tail(grad), tail(expected_m), tail(expected_v),
                         segments, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 7};
    cpu.adamw_step(step);
    const cuda::AdamwScalars scalars{step.lr, step.beta1, step.beta2, step.eps, step.grad_scale,
                                     1.0f / (1.0f - std::pow(step.beta1, 7.0f)),
                                     1.0f / (1.0f - std::pow(step.beta2, 7.0f))};
    ASSERT_TRUE(launched(cuda::adamw(tail(actual_master).as<float>(), tail(actual_param).data, kind(),
                                     tail(grad).as<float>(), tail(actual_m).as<float>(), tail(actual_v).as<float>(),
                                     ranges.data(), static_cast<int64_t>(ranges.size()), scalars)));
    const std::string what = shift == 0 ? "aligned: " : "one element past: ";
    expect_close(actual_master, expected_master, 1e-6, what + "master");
    expect_close(actual_m, expected_m, 1e-6, what + "exp_avg");
    expect_close(actual_v, expected_v, 1e-6, what + "exp_avg_sq");
    expect_close(actual_param, expected_param, bound(dtype()), what + "param");
    const std::vector<float> before = master.floats(), after = actual_master.floats();
    for (int64_t i = 0; i < n; ++i) {  // the gaps, exactly as they were
      const bool covered = std::any_of(segments.begin(), segments.end(), [&](const AdamwSegment& s) {
        return i >= s.offset && i < s.offset + s.count;
      });
      if (covered) {
        EXPECT_NE(after[shift + i], before[shift + i]) << what << "element " << i << " not updated";
      } else {
        EXPECT_EQ(after[shift + i], before[shift + i]) << what << "element " << i << " of a gap";
      }
    }
  }

}

// The sum of squares against a double sum: packs with a tail of 0 and 2 elements, a buffer one
// element past 16-byte alignment (one element at a time), and one long enough that each thread
// loads its packs in flight more than once (over 4 x 512 x 256 packs).
TEST_P(EmulatedKernels, SumOfSquaresOverPacksTheirTailAndUnalignedBuffers) {
  const HostTensor values = floats({2'200'003}, 7);
  const HostTensor partials = HostTensor::poisoned(DType::F32, {2 * cuda::kSumBlocks + 2});
  auto* scratch = partials.as<double>();
  for (const auto& [count, shift] : {std::pair<int64_t, int64_t>{4000, 0}, {3998, 0}, {3999, 1}, {2'200'002, 1},
                                    {2'200'000, 0}}) {
    const float* in = values.as<float>() + shift;
    double expected = 0.0;
    for (int64_t i = 0; i < count; ++i) expected += static_cast<double>(in[i]) * in[i];
    ASSERT_TRUE(launched(cuda::sum_of_squares(in, count, scratch, scratch + cuda::kSumBlocks)));
    EXPECT_NEAR(scratch[cuda::kSumBlocks], expected, 1e-12 * expected) << count << " elements from " << shift;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, EmulatedKernels,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(cuda_emulator::Schedule::Forward,
                                                              cuda_emulator::Schedule::Reverse)),
                         [](const ::testing::TestParamInfo<EmulatedKernels::ParamType>& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == cuda_emulator::Schedule::Forward
                                       ? "_lowest_first"
                                       : "_highest_first");
                         });

}  // namespace
}  // namespace kiln::testing
