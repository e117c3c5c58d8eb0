// GradStore::Write (ops.h) on every back-end: each op that stores a parameter gradient, and
// LayerNorm's input gradient, leaves when it writes over NaN exactly the values it leaves when it
// adds into zeros (compared with ==: a zero's sign may differ, NaN never passes). Cases: the matmul
// backward in both layouts, with and without the bias, with GELU's derivative, with fp8 casts, and
// with a bias gradient that is not 16-byte aligned (the CUDA back-end then copies the epilogue's
// result instead of letting it write in place); LayerNorm's backward with its input gradient and
// its parameter gradients written in turn; the embedding backward's dwpe, whose rows past T a
// write sets to zero. fp32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 64, K = 48, N = 32;  // multiples of 16, as fp8 products ask

// What a stored gradient holds before the op: zeros to add into, NaN to write over.
std::vector<float> held_before(GradStore store, int64_t count) {
  return std::vector<float>(static_cast<size_t>(count), store == GradStore::Add ? 0.0f : NAN);
}

void expect_equal(const std::vector<float>& written, const std::vector<float>& added, const std::string& what) {
  ASSERT_EQ(written.size(), added.size()) << what;
  for (size_t i = 0; i < added.size(); ++i) ASSERT_EQ(written[i], added[i]) << what << " element " << i;
}

using Case = std::tuple<std::string, DType>;

class GradStoreWrite : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string reason = backend_skip_reason(std::get<0>(GetParam()));
    if (!reason.empty()) GTEST_SKIP() << reason;
    backend_ = make_backend(std::get<0>(GetParam()));
  }
  DType dtype() const { return std::get<1>(GetParam()); }

  struct MatmulCase {
    WeightLayout layout = WeightLayout::InOut;
    bool bias = true, gelu = false, fp8 = false;
    int64_t bias_offset = 0;  // floats before dbias in its buffer
  };
  // dweight and dbias (concatenated) after one matmul backward storing them as `store`.
  std::vector<float> matmul_gradients(const MatmulCase& c, GradStore store) {
    DeviceTensors t(*backend_, dtype());
    Rng rng(3);
    const bool in_out = c.layout == WeightLayout::InOut;
    const Shape weight_shape = in_out ? Shape{K, N} : Shape{N, K};
    const Tensor in = t.acts(random_floats(M * K, rng), {M, K}), dout = t.acts(random_floats(M * N, rng), {M, N});
    const Tensor weight = t.acts(random_floats(K * N, rng, 0.2f), weight_shape);
    const Tensor pre = c.gelu ? t.acts(random_floats(M * K, rng), {M, K}) : Tensor{};
    const Fp8Matmul casts = fixed_fp8_casts(t);
    MatmulBackward op{t.poisoned_acts({M, K}), t.floats(held_before(store, K * N), weight_shape), Tensor{}, dout,
                      in, weight, c.layout, pre, c.fp8 ? &casts : nullptr};
    if (c.bias) op.dbias = t.floats(held_before(store, c.bias_offset + N), {c.bias_offset + N}).slice(c.bias_offset, N);
    op.param_store = store;
    backend_->matmul_backward(op);
    std::vector<float> grads = t.download(op.dweight);
    if (c.bias) {
      const std::vector<float> dbias = t.download(op.dbias);
      grads.insert(grads.end(), dbias.begin(), dbias.end());
    }
    return grads;
  }
  void expect_matmul_writes(const MatmulCase& c, const std::string& what) {
    expect_equal(matmul_gradients(c, GradStore::Write), matmul_gradients(c, GradStore::Add), what);
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(GradStoreWrite, MatmulBackwardWritesWhatItWouldAddToZeros) {
  expect_matmul_writes({WeightLayout::InOut, true}, "InOut with bias");
  expect_matmul_writes({WeightLayout::OutIn, false}, "OutIn (the classifier)");
  expect_matmul_writes({WeightLayout::InOut, true, true}, "with GELU's derivative");
  expect_matmul_writes({WeightLayout::InOut, true, false, false, 1}, "dbias 4 bytes into its buffer");
  if (dtype() == DType::BF16) expect_matmul_writes({WeightLayout::InOut, true, true, true}, "fp8");
}

TEST_P(GradStoreWrite, LayerNormBackwardWritesEachGradientItIsToldTo) {
  constexpr int64_t C = 40;
  // din, then dweight and dbias, after one backward storing din and the parameters as told.
  const auto gradients = [&](GradStore din_store, GradStore param_store) {
    DeviceTensors t(*backend_, dtype());
    Rng rng(4);
    const Tensor in = t.acts(random_floats(M * C, rng, 2.0f), {M, C}), dout = t.acts(random_floats(M * C, rng), {M, C});
    const Tensor weight = t.acts(random_floats(C, rng), {C}), bias = t.acts(random_floats(C, rng), {C});
    const Tensor mean = t.poisoned({M}), rstd = t.poisoned({M});
    backend_->layernorm_forward({t.poisoned_acts({M, C}), mean, rstd, in, weight, bias});
    const Tensor din = t.acts(held_before(din_store, M * C), {M, C});
    const Tensor dweight = t.floats(held_before(param_store, C), {C}), dbias = t.floats(held_before(param_store, C), {C});
    backend_->layernorm_backward({din, dweight, dbias, dout, in, weight, mean, rstd, param_store, din_store});
    std::vector<float> all = t.download(din);
    for (const Tensor* grad : {&dweight, &dbias}) {
      const std::vector<float> values = t.download(*grad);
      all.insert(all.end(), values.begin(), values.end());
    }
    return all;
  };
  const std::vector<float> added = gradients(GradStore::Add, GradStore::Add);
  expect_equal(gradients(GradStore::Write, GradStore::Add), added, "din written");
  expect_equal(gradients(GradStore::Add, GradStore::Write), added, "parameter gradients written");
}

TEST_P(GradStoreWrite, EmbeddingBackwardWritesAllOfDwpe) {
  constexpr int64_t B = 2, T = 24, C = 32, Vp = 16, maxT = 30;  // rows T..maxT have no position
  const auto dwpe_after = [&](GradStore store) {
    DeviceTensors t(*backend_, dtype());
    Rng rng(5);
    std::vector<int32_t> tokens(static_cast<size_t>(B * T));
    for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(Vp));
    const Tensor dout = t.acts(random_floats(B * T * C, rng), {B, T, C});
    const Tensor dwte = t.floats(std::vector<float>(Vp * C, 0.0f), {Vp, C});
    const Tensor dwpe = t.floats(held_before(store, maxT * C), {maxT, C});
    backend_->embedding_backward({dwte, dwpe, dout, t.ints(tokens, {B, T}), store});
    return t.download(dwpe);
  };
  expect_equal(dwpe_after(GradStore::Write), dwpe_after(GradStore::Add), "dwpe");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GradStoreWrite,
                         ::testing::Combine(::testing::ValuesIn(all_backend_names()),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace kiln::testing
