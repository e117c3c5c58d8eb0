// The attention casting for its fp8 neighbours on every back-end. Forward (ops.h, AttentionForward
// with fp8): its output is written as without fp8, and its codes, in both layouts (or only by
// rows), are the cast of that output c_proj's forward would make, with the amax; c_proj reading
// them gives bit for bit what it gives casting the output itself. Backward (AttentionBackward with
// fp8; MatmulBackward with dout cast already): its codes, in both layouts, are the cast of the
// gradient it would otherwise store, its amax folds that gradient's max |x|, its bias gradient is
// that gradient's column sums (added or written), and c_attn's backward reading the codes gives
// bit for bit what it gives casting the stored gradient itself. Shapes cross the CUDA kernels'
// edges: sequences of 80 and 72 positions (a 64-position tile and part of another; 72 starts the
// second sequence off a 16-byte boundary, so a transpose is written byte by byte), heads of 64
// (the tiled kernels' width), 24 (zero-padded inside a tile) and 136 (the general kernels, then a
// cast). All of it with attention dropout too (the mask drawn inside the kernels that cast), whose
// codes CUDA writes as the CPU does. Arguments that do not fit are refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"
#include "support/fp8_codes.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

constexpr int64_t kB = 2, kHeads = 2, kIn = 32;  // c_attn: [M, kIn] -> dqkv [M, 3C]

struct Shape3 {
  int64_t T, hs;
};

// The attention's inputs from a forward on random q, k, v, and c_attn's operands: the same on
// every run of one shape.
struct Inputs {
  int64_t M, N;  // B*T positions, 3C
  Tensor qkv, out, lse, dout, ln, weight, bias;
};
Inputs random_inputs(DeviceTensors& t, Backend& backend, Shape3 s, AttentionDropout dropout) {
  const int64_t C = kHeads * s.hs, M = kB * s.T, N = 3 * C;
  Rng rng(5);
  Inputs in{M, N, t.acts(random_floats(M * N, rng), {kB, s.T, N}), t.poisoned_acts({kB, s.T, C}),
            t.poisoned({kB, kHeads, s.T}), t.acts(random_floats(M * C, rng), {kB, s.T, C}),
            t.acts(random_floats(M * kIn, rng), {M, kIn}), t.acts(random_floats(kIn * N, rng, 0.2f), {kIn, N}),
            t.acts(random_floats(N, rng), {N})};
  AttentionForward forward{in.out, in.lse, in.qkv, Tensor{}, static_cast<int>(kHeads), AttentionMask::Causal};
  forward.dropout = dropout;
  backend.attention_forward(forward);
  return in;
}

// What c_attn's backward leaves, and what the gradient's cast left.
struct Outcome {
  std::vector<float> dqkv;                 // the stored gradient (the plain run only)
  std::vector<float> codes, codes_t;       // decoded codes (the cast run only)
  std::vector<float> din, dweight, dbias;  // c_attn's gradients
  float amax = 0.0f;
};

constexpr float kDoutScale = 8.0f, kAmaxBefore = 1e-3f, kBiasBefore = 0.5f;
constexpr AttentionDropout kNoDropout{}, kDropout{0.2f, 13, 5};

std::string dropout_name(const AttentionDropout& dropout) {
  return dropout.active() ? ", dropout " + std::to_string(dropout.probability) : "";
}

// `cast`: the attention casts its gradient and takes the bias gradient, and c_attn's backward reads
// the codes; else the attention stores dqkv and c_attn's backward casts it. `store`: the bias
// gradient's GradStore, over kBiasBefore. `dropout`: the forward's and the backward's.
Outcome run(Backend& backend, Shape3 s, DType format, bool cast, GradStore store = GradStore::Add,
            AttentionDropout dropout = kNoDropout) {
  DeviceTensors t(backend, DType::BF16);
  const Inputs in = random_inputs(t, backend, s, dropout);
  Fp8Matmul qkv{fp8_operand(t, 16.0f, 0.0f), fp8_operand(t, 32.0f, 0.0f), fp8_operand(t, kDoutScale, kAmaxBefore),
                format};
  const Tensor din = t.poisoned_acts({in.M, kIn}), dweight = t.floats(std::vector<float>(kIn * in.N, 0.0f), {kIn, in.N});
  const Tensor dbias = t.floats(std::vector<float>(static_cast<size_t>(in.N), kBiasBefore), {in.N});
  AttentionBackward attention{t.poisoned_acts({kB, s.T, in.N}), in.dout, in.qkv, in.out, in.lse, Tensor{},
                              static_cast<int>(kHeads), AttentionMask::Causal};
  attention.dropout = dropout;
  MatmulBackward expansion{din, dweight, dbias, attention.dqkv, in.ln, in.weight, WeightLayout::InOut, Tensor{}, &qkv};
  expansion.param_store = store;
  Outcome outcome;
  if (cast) {
    attention.dqkv = Tensor{};
    attention.fp8 = &qkv;
    attention.dqkv_fp8 = poisoned_codes(t, {in.M, in.N}, format);
    attention.dqkv_fp8_t = poisoned_codes(t, {in.N, in.M}, format);
    attention.dbias = dbias;
    attention.param_store = store;
    expansion.dout = attention.dqkv_fp8;
    expansion.dout_fp8_t = attention.dqkv_fp8_t;
    expansion.dbias = Tensor{};
  }
  backend.attention_backward(attention);
  backend.matmul_backward(expansion);
  if (cast) {
    outcome.codes = t.download(attention.dqkv_fp8);
    outcome.codes_t = t.download(attention.dqkv_fp8_t);
  } else {
    outcome.dqkv = t.download(attention.dqkv);
  }
  outcome.din = t.download(din);
  outcome.dweight = t.download(dweight);
  outcome.dbias = t.download(dbias);
  outcome.amax = t.download(qkv.dout.amax)[0];
  return outcome;
}

const Shape3 kShapes[] = {{80, 64}, {72, 64}, {80, 24}, {80, 136}};

class Fp8AttentionGradient : public OnEachBackend {};

TEST_P(Fp8AttentionGradient, CodesAreTheProductsOwnCastOfTheGradient) {
  for (const Shape3 s : kShapes) {
    for (const auto& [format, dropout] : {std::pair{DType::F8E5M2, kNoDropout}, {DType::F8E4M3, kNoDropout},
                                         {DType::F8E5M2, kDropout}}) {
      SCOPED_TRACE("T " + std::to_string(s.T) + ", heads of " + std::to_string(s.hs) + ", " +
                   std::string(dtype_name(format)) + dropout_name(dropout));
      const Outcome plain = run(*backend_, s, format, false, GradStore::Add, dropout);
      const Outcome cast = run(*backend_, s, format, true, GradStore::Add, dropout);
      const int64_t M = kB * s.T, N = 3 * kHeads * s.hs;
      EXPECT_EQ(cast.codes, decoded_cast(plain.dqkv, kDoutScale, format));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(cast.codes_t[n * M + m], cast.codes[m * N + n]) << "codes (" << m << ", " << n << ") transposed";
      EXPECT_EQ(cast.din, plain.din);
      EXPECT_EQ(cast.dweight, plain.dweight);
      EXPECT_EQ(cast.amax, plain.amax);
      float largest = kAmaxBefore;
      for (const float x : plain.dqkv) largest = std::max(largest, std::fabs(x));
      EXPECT_EQ(cast.amax, largest);
      // The column sums, in another order on a GPU (per tile of positions, then the tiles).
      std::vector<float> sums(static_cast<size_t>(N), 0.0f);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) sums[n] += plain.dqkv[m * N + n];
      for (int64_t n = 0; n < N; ++n) {
        ASSERT_NEAR(cast.dbias[n], kBiasBefore + sums[n], 1e-5 * (1.0 + std::fabs(sums[n]))) << "column " << n;
        ASSERT_NEAR(cast.dbias[n], plain.dbias[n], 1e-5 * (1.0 + std::fabs(sums[n]))) << "column " << n;
      }
      if (GetParam() == "cpu") {
        EXPECT_EQ(cast.dbias, plain.dbias);  // the same sums, in the same order
      }
    }
  }
}

TEST_P(Fp8AttentionGradient, TheBiasGradientIsWrittenWhenAsked) {
  const Shape3 s = kShapes[1];
  const Outcome added = run(*backend_, s, DType::F8E5M2, true, GradStore::Add);
  const Outcome written = run(*backend_, s, DType::F8E5M2, true, GradStore::Write);
  for (size_t n = 0; n < added.dbias.size(); ++n) EXPECT_FLOAT_EQ(written.dbias[n] + kBiasBefore, added.dbias[n]);
}

// With the default back-end (mma.sync, the backward deterministic), on wgmma where the GPU has it,
// and on wgmma adding dQ atomically, whose codes a pass after the kernel writes (its rounding may
// differ run to run on a GPU: compared by tolerance).
TEST_P(Fp8AttentionGradient, CudaCastsAsTheCpuDoes) {
  if (GetParam() == "cpu") GTEST_SKIP() << "compares another back-end with the CPU";
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  BackendOptions wgmma, wgmma_atomic;
  wgmma.warpgroup_attention = wgmma_atomic.warpgroup_attention = true;
  wgmma_atomic.deterministic_attention = false;
  const std::unique_ptr<Backend> on_wgmma = make_backend(GetParam(), wgmma);
  const std::unique_ptr<Backend> adding_atomically = make_backend(GetParam(), wgmma_atomic);
  for (Backend* backend : {backend_.get(), on_wgmma.get(), adding_atomically.get()})
  for (const Shape3 s : kShapes)
  for (const AttentionDropout dropout : {kNoDropout, kDropout}) {
    SCOPED_TRACE("T " + std::to_string(s.T) + ", heads of " + std::to_string(s.hs) +
                 (backend == backend_.get() ? "" : backend == on_wgmma.get() ? ", wgmma" : ", wgmma, dQ added atomically") +
                 dropout_name(dropout));
    const Outcome expected = run(*cpu, s, DType::F8E5M2, true, GradStore::Add, dropout);
    const Outcome actual = run(*backend, s, DType::F8E5M2, true, GradStore::Add, dropout);
    // E5M2 keeps 2 mantissa bits: a gradient element that rounds differently moves one code.
    EXPECT_LT(normalized_error(actual.codes, expected.codes), 5e-2);
    EXPECT_LT(normalized_error(actual.dbias, expected.dbias), 1e-2);
    EXPECT_LT(normalized_error(actual.dweight, expected.dweight), 5e-2);
    EXPECT_NEAR(actual.amax, expected.amax, 1e-2 * expected.amax);
  }
}

TEST_P(Fp8AttentionGradient, ArgumentsThatDoNotFitAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Shape3 s = kShapes[0];
  const Inputs in = random_inputs(t, *backend_, s, kNoDropout);
  Fp8Matmul qkv{fp8_operand(t, 1.0f, 0.0f), fp8_operand(t, 1.0f, 0.0f), fp8_operand(t, 1.0f, 0.0f), DType::F8E5M2};
  const auto cast = [&] {
    AttentionBackward a{Tensor{}, in.dout, in.qkv, in.out, in.lse, Tensor{}, static_cast<int>(kHeads)};
    a.fp8 = &qkv;
    a.dqkv_fp8 = poisoned_codes(t, {in.M, in.N}, DType::F8E5M2);
    a.dqkv_fp8_t = poisoned_codes(t, {in.N, in.M}, DType::F8E5M2);
    return a;
  };
  const auto expect_refusal = [&](const AttentionBackward& a, const std::string& message) {
    const std::string error = error_of([&] { backend_->attention_backward(a); });
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  AttentionBackward stored = cast();
  stored.dqkv = t.poisoned_acts({kB, s.T, in.N});
  expect_refusal(stored, "attention_backward: argument 'dqkv' is given with 'fp8' (the gradient is only cast)");
  AttentionBackward e4m3_codes = cast();
  e4m3_codes.dqkv_fp8 = poisoned_codes(t, {in.M, in.N}, DType::F8E4M3);
  expect_refusal(e4m3_codes, "argument 'dqkv_fp8' has dtype fp8_e4m3, expected fp8_e5m2");
  AttentionBackward untransposed = cast();
  untransposed.dqkv_fp8_t = poisoned_codes(t, {in.M, in.N}, DType::F8E5M2);
  expect_refusal(untransposed, "argument 'dqkv_fp8_t' must be [3C, B*T] = [384, 160], got [160, 384]");
  AttentionBackward without_fp8 = cast();
  without_fp8.fp8 = nullptr;
  without_fp8.dqkv = t.poisoned_acts({kB, s.T, in.N});
  expect_refusal(without_fp8, "fp8 codes of dqkv or a bias gradient are given without 'fp8'");
  DeviceTensors fp32(*backend_, DType::F32);
  const Inputs wide = random_inputs(fp32, *backend_, s, kNoDropout);
  AttentionBackward in_fp32 = cast();
  in_fp32.dout = wide.dout;
  in_fp32.qkv = wide.qkv;
  in_fp32.out = wide.out;
  expect_refusal(in_fp32, "attention_backward: a gradient cast to fp8 needs bf16 or fp16, not fp32");

  const AttentionBackward a = cast();
  const Tensor din = t.poisoned_acts({in.M, kIn}), dweight = t.poisoned({kIn, in.N});
  const auto reads_codes = [&] {
    MatmulBackward b{din, dweight, Tensor{}, a.dqkv_fp8, in.ln, in.weight, WeightLayout::InOut, Tensor{}, &qkv};
    b.dout_fp8_t = a.dqkv_fp8_t;
    return b;
  };
  const auto expect_matmul_refusal = [&](const MatmulBackward& b, const std::string& message) {
    const std::string error = error_of([&] { backend_->matmul_backward(b); });
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  MatmulBackward with_bias = reads_codes();
  with_bias.dbias = t.poisoned({in.N});
  expect_matmul_refusal(with_bias, "argument 'dbias' is given with 'dout' cast already (its writer took the bias");
  MatmulBackward alone = reads_codes();
  alone.dout_fp8_t = Tensor{};
  expect_matmul_refusal(alone, "argument 'dout' is codes without their transpose 'dout_fp8_t'");
  MatmulBackward full_precision = reads_codes();
  full_precision.fp8 = nullptr;
  expect_matmul_refusal(full_precision, "argument 'dout' is fp8 codes for a product without fp8");
  MatmulBackward untransposed_codes = reads_codes();
  untransposed_codes.dout_fp8_t = a.dqkv_fp8;
  expect_matmul_refusal(untransposed_codes, "argument 'dout_fp8_t' must be [N, M] = [384, 160], got [160, 384]");
  MatmulBackward stray = reads_codes();
  stray.dout = in.qkv.reshaped({in.M, in.N});
  expect_matmul_refusal(stray, "argument 'dout_fp8_t' is given with 'dout' in the compute dtype");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8AttentionGradient, ::testing::ValuesIn(all_backend_names()),
                         backend_param_name);

// What the forward and c_proj's forward leave.
struct ForwardOutcome {
  std::vector<float> out, lse, codes, codes_t, projected;
  float amax = 0.0f;
};

constexpr float kOutScale = 16.0f;

// `cast`: the attention casts its output (`transposed_too`: in both layouts) and c_proj reads the
// codes; else c_proj casts the output, keeping the transpose.
ForwardOutcome run_forward(Backend& backend, Shape3 s, bool cast, bool transposed_too = true,
                           AttentionDropout dropout = kNoDropout) {
  DeviceTensors t(backend, DType::BF16);
  const int64_t C = kHeads * s.hs, M = kB * s.T;
  Rng rng(9);
  const Tensor qkv = t.acts(random_floats(M * 3 * C, rng), {kB, s.T, 3 * C});
  const Tensor proj_weight = t.acts(random_floats(C * kIn, rng, 0.1f), {C, kIn}), out = t.poisoned_acts({kB, s.T, C});
  const Tensor lse = t.poisoned({kB, kHeads, s.T}), projected = t.poisoned_acts({M, kIn});
  Fp8Matmul proj{fp8_operand(t, kOutScale, kAmaxBefore), fp8_operand(t, 64.0f, 0.0f), Fp8Operand{}};
  const Tensor codes = poisoned_codes(t, {M, C}, DType::F8E4M3), codes_t = poisoned_codes(t, {C, M}, DType::F8E4M3);
  AttentionForward attention{out, lse, qkv, Tensor{}, static_cast<int>(kHeads), AttentionMask::Causal};
  attention.dropout = dropout;
  if (cast) {
    attention.fp8 = &proj.in;
    attention.out_fp8 = codes;
    attention.out_fp8_t = transposed_too ? codes_t : Tensor{};
  }
  backend.attention_forward(attention);
  if (cast)
    backend.matmul_forward({projected, codes, proj_weight, Tensor{}, WeightLayout::InOut, Tensor{}, &proj});
  else
    backend.matmul_forward({projected, out.reshaped({M, C}), proj_weight, Tensor{}, WeightLayout::InOut, Tensor{},
                            &proj, codes_t});
  return {t.download(out), t.download(lse), cast ? t.download(codes) : std::vector<float>{},
          transposed_too ? t.download(codes_t) : std::vector<float>{}, t.download(projected),
          t.download(proj.in.amax)[0]};
}

class Fp8AttentionOutput : public OnEachBackend {};

TEST_P(Fp8AttentionOutput, CodesAreTheProjectionsOwnCastOfTheOutput) {
  for (const Shape3 s : kShapes)
  for (const AttentionDropout dropout : {kNoDropout, kDropout}) {
    SCOPED_TRACE("T " + std::to_string(s.T) + ", heads of " + std::to_string(s.hs) + dropout_name(dropout));
    const ForwardOutcome plain = run_forward(*backend_, s, false, true, dropout);
    const ForwardOutcome cast = run_forward(*backend_, s, true, true, dropout);
    const int64_t M = kB * s.T, C = kHeads * s.hs;
    EXPECT_EQ(cast.out, plain.out);  // written as without fp8
    EXPECT_EQ(cast.lse, plain.lse);
    EXPECT_EQ(cast.codes_t, plain.codes_t);  // what c_proj's own cast kept
    EXPECT_EQ(cast.codes, decoded_cast(plain.out, kOutScale, DType::F8E4M3));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(cast.codes_t[c * M + m], cast.codes[m * C + c]) << "code (" << m << ", " << c << ") transposed";
    EXPECT_EQ(cast.projected, plain.projected);
    EXPECT_EQ(cast.amax, plain.amax);
    EXPECT_GT(cast.amax, kAmaxBefore);
    // Only by rows (a forward whose backward reads no codes, block.h): the same codes and amax.
    const ForwardOutcome rows_only = run_forward(*backend_, s, true, /*transposed_too=*/false, dropout);
    EXPECT_EQ(rows_only.codes, cast.codes);
    EXPECT_EQ(rows_only.amax, cast.amax);
  }
}

// The dropped output's codes on a GPU are the CPU's but for an element rounding the other way:
// the kernels that cast draw the same mask.
TEST_P(Fp8AttentionOutput, CudaCastsTheDroppedOutputAsTheCpuDoes) {
  if (GetParam() == "cpu") GTEST_SKIP() << "compares another back-end with the CPU";
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (const Shape3 s : kShapes) {
    SCOPED_TRACE("T " + std::to_string(s.T) + ", heads of " + std::to_string(s.hs));
    const ForwardOutcome expected = run_forward(*cpu, s, true, true, kDropout);
    const ForwardOutcome actual = run_forward(*backend_, s, true, true, kDropout);
    const ForwardOutcome undropped = run_forward(*cpu, s, true, true, kNoDropout);
    EXPECT_LT(normalized_error(actual.out, expected.out), 1e-2);
    EXPECT_LT(normalized_error(actual.codes, expected.codes), 5e-2);
    EXPECT_LT(normalized_error(actual.codes_t, expected.codes_t), 5e-2);
    EXPECT_NEAR(actual.amax, expected.amax, 1e-2 * expected.amax);
    EXPECT_GT(normalized_error(undropped.codes, expected.codes), 0.2) << "the mask changes the codes";
  }
}

TEST_P(Fp8AttentionOutput, ArgumentsThatDoNotFitAreRefused) {
  DeviceTensors t(*backend_, DType::BF16);
  const Shape3 s = kShapes[0];
  const int64_t C = kHeads * s.hs, M = kB * s.T;
  const Fp8Operand scale = fp8_operand(t, 1.0f, 0.0f);
  const auto cast = [&](DeviceTensors& in_dtype) {
    AttentionForward a{in_dtype.poisoned_acts({kB, s.T, C}), t.poisoned({kB, kHeads, s.T}),
                       in_dtype.acts(std::vector<float>(M * 3 * C, 0.5f), {kB, s.T, 3 * C}), Tensor{},
                       static_cast<int>(kHeads)};
    a.fp8 = &scale;
    a.out_fp8 = poisoned_codes(t, {M, C}, DType::F8E4M3);
    a.out_fp8_t = poisoned_codes(t, {C, M}, DType::F8E4M3);
    return a;
  };
  const auto expect_refusal = [&](const AttentionForward& a, const std::string& message) {
    const std::string error = error_of([&] { backend_->attention_forward(a); });
    EXPECT_NE(error.find(message), std::string::npos) << error;
  };
  AttentionForward nowhere = cast(t);
  nowhere.out_fp8 = Tensor{};
  expect_refusal(nowhere, "attention_forward: argument 'out_fp8' is missing");
  AttentionForward e5m2 = cast(t);
  e5m2.out_fp8 = poisoned_codes(t, {M, C}, DType::F8E5M2);
  expect_refusal(e5m2, "argument 'out_fp8' has dtype fp8_e5m2, expected fp8_e4m3");
  AttentionForward untransposed = cast(t);
  untransposed.out_fp8_t = poisoned_codes(t, {M, C}, DType::F8E4M3);
  expect_refusal(untransposed, "argument 'out_fp8_t' must be [C, B*T] = [128, 160], got [160, 128]");
  AttentionForward without_fp8 = cast(t);
  without_fp8.fp8 = nullptr;
  expect_refusal(without_fp8, "attention_forward: fp8 codes of the output are given without 'fp8'");
  DeviceTensors fp32(*backend_, DType::F32);
  expect_refusal(cast(fp32), "attention_forward: an output cast to fp8 needs bf16 or fp16, not fp32");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8AttentionOutput, ::testing::ValuesIn(all_backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace kiln::testing
