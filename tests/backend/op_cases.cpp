// The op cases: several shapes per op, odd sizes and head dims 24, 80, 64, 128 and 256. Parameter
// gradients are checked for "+=" by seeding them with random values and subtracting the seed;
// activation gradients are poisoned with NaN to catch unwritten elements.
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "backend/op_case.h"
#include "kiln/core/philox.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

std::vector<float> subtract(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> difference(after.size());
  for (size_t i = 0; i < after.size(); ++i) difference[i] = after[i] - before[i];
  return difference;
}

double gelu(double v) {
  return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
}

// ---- matmul ---------------------------------------------------------------------------------
// out[M,N] = in[M,K] weight + bias in double, weight [K,N] (InOut) or [N,K] (OutIn); bias may be empty.
std::vector<double> matmul_reference(const std::vector<double>& in, const std::vector<double>& weight,
                                     const std::vector<double>* bias, int64_t M, int64_t K, int64_t N,
                                     WeightLayout layout) {
  const bool in_out = layout == WeightLayout::InOut;
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = bias ? (*bias)[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) sum += in[m * K + k] * (in_out ? weight[k * N + n] : weight[n * K + k]);
      out[m * N + n] = sum;
    }
  return out;
}

OpCase matmul_case(int64_t M, int64_t K, int64_t N, bool bias, WeightLayout layout, Rng& rng) {
  const bool in_out = layout == WeightLayout::InOut;
  const Shape weight_shape = in_out ? Shape{K, N} : Shape{N, K};
  OpCase op;
  op.name = fmt::format("matmul_{}_M{}_K{}_N{}{}", in_out ? "inout" : "outin", M, K, N, bias ? "_bias" : "");
  op.inputs = {random_floats(static_cast<size_t>(M * K), rng), random_floats(static_cast<size_t>(K * N), rng)};
  if (bias) op.inputs.push_back(random_floats(static_cast<size_t>(N), rng));
  op.differentiable = bias ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0, 1};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& in) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({M, N});
    backend.matmul_forward({out, t.acts(in[0], {M, K}), t.acts(in[1], weight_shape),
                            bias ? t.acts(in[2], {N}) : Tensor{}, layout});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& in) {
    return matmul_reference(in[0], in[1], bias ? &in[2] : nullptr, M, K, N, layout);
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& in, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Rng seed_rng(7);
    const std::vector<float> dweight_seed = random_floats(in[1].size(), seed_rng);
    const std::vector<float> dbias_seed = random_floats(static_cast<size_t>(N), seed_rng);
    Tensor din = t.poisoned_acts({M, K});
    Tensor dweight = t.floats(dweight_seed, weight_shape);
    Tensor dbias = bias ? t.floats(dbias_seed, {N}) : Tensor{};
    backend.matmul_backward({din, dweight, dbias, t.acts(dout, {M, N}), t.acts(in[0], {M, K}),
                             t.acts(in[1], weight_shape), layout});
    FloatInputs grads = {t.download(din), subtract(t.download(dweight), dweight_seed)};
    if (bias) grads.push_back(subtract(t.download(dbias), dbias_seed));
    return grads;
  };
  return op;
}

// The attention projection with the residual add inside it: out = in W (+ b) + residual. Its
// backward is the plain matmul's (the add passes dout through), checked by those cases.
OpCase matmul_residual_case(int64_t M, int64_t K, int64_t N, bool bias, WeightLayout layout, Rng& rng) {
  const bool in_out = layout == WeightLayout::InOut;
  const Shape weight_shape = in_out ? Shape{K, N} : Shape{N, K};
  OpCase op;
  op.name = fmt::format("matmul_residual_{}_M{}_K{}_N{}{}", in_out ? "inout" : "outin", M, K, N, bias ? "_bias" : "");
  op.inputs = {random_floats(static_cast<size_t>(M * K), rng), random_floats(static_cast<size_t>(K * N), rng),
               random_floats(static_cast<size_t>(M * N), rng, 4.0f), random_floats(static_cast<size_t>(N), rng)};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& in) {
    DeviceTensors t(backend, dtype);
    MatmulForward product{t.poisoned_acts({M, N}), t.acts(in[0], {M, K}), t.acts(in[1], weight_shape),
                          bias ? t.acts(in[3], {N}) : Tensor{}, layout};
    product.residual = t.acts(in[2], {M, N});
    backend.matmul_forward(product);
    return t.download(product.out);
  };
  op.reference = [=](const DoubleInputs& in) {
    std::vector<double> out = matmul_reference(in[0], in[1], bias ? &in[3] : nullptr, M, K, N, layout);
    for (size_t i = 0; i < out.size(); ++i) out[i] += in[2][i];
    return out;
  };
  return op;
}

// The MLP's forward fusion: out = in W + b and gelu_out = gelu(out), flattened [out, gelu_out].
// Its backward is the plain matmul's and gelu's, checked by their cases.
OpCase matmul_gelu_case(int64_t M, int64_t K, int64_t N, Rng& rng) {
  OpCase op;
  op.name = fmt::format("matmul_gelu_M{}_K{}_N{}", M, K, N);
  op.inputs = {random_floats(static_cast<size_t>(M * K), rng), random_floats(static_cast<size_t>(K * N), rng),
               random_floats(static_cast<size_t>(N), rng)};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& in) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({M, N}), activated = t.poisoned_acts({M, N});
    backend.matmul_forward({out, t.acts(in[0], {M, K}), t.acts(in[1], {K, N}), t.acts(in[2], {N}),
                            WeightLayout::InOut, activated});
    std::vector<float> both = t.download(out);
    const std::vector<float> second = t.download(activated);
    both.insert(both.end(), second.begin(), second.end());
    return both;
  };
  op.reference = [=](const DoubleInputs& in) {
    std::vector<double> both = matmul_reference(in[0], in[1], &in[2], M, K, N, WeightLayout::InOut);
    for (int64_t i = 0; i < M * N; ++i) both.push_back(gelu(both[static_cast<size_t>(i)]));
    return both;
  };
  return op;
}

// The MLP's backward fusion: out = gelu(z) W + b, whose backward takes `in` = gelu(z) and
// gelu_in = z and returns the gradient of z directly.
OpCase gelu_matmul_case(int64_t M, int64_t K, int64_t N, WeightLayout layout, Rng& rng) {
  const bool in_out = layout == WeightLayout::InOut;
  const Shape weight_shape = in_out ? Shape{K, N} : Shape{N, K};
  OpCase op;
  op.name = fmt::format("gelu_matmul_{}_M{}_K{}_N{}", in_out ? "inout" : "outin", M, K, N);
  op.inputs = {random_floats(static_cast<size_t>(M * K), rng, 2.0f), random_floats(static_cast<size_t>(K * N), rng),
               random_floats(static_cast<size_t>(N), rng)};
  op.differentiable = {0, 1, 2};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& in) {
    DeviceTensors t(backend, dtype);
    Tensor activated = t.poisoned_acts({M, K}), out = t.poisoned_acts({M, N});
    backend.gelu_forward({activated, t.acts(in[0], {M, K})});
    backend.matmul_forward({out, activated, t.acts(in[1], weight_shape), t.acts(in[2], {N}), layout});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& in) {
    std::vector<double> activated(in[0].size());
    for (size_t i = 0; i < activated.size(); ++i) activated[i] = gelu(in[0][i]);
    return matmul_reference(activated, in[1], &in[2], M, K, N, layout);
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& in, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Rng seed_rng(13);
    const std::vector<float> dweight_seed = random_floats(in[1].size(), seed_rng);
    const std::vector<float> dbias_seed = random_floats(static_cast<size_t>(N), seed_rng);
    Tensor pre = t.acts(in[0], {M, K}), activated = t.poisoned_acts({M, K});
    backend.gelu_forward({activated, pre});
    Tensor dpre = t.poisoned_acts({M, K}), dweight = t.floats(dweight_seed, weight_shape);
    Tensor dbias = t.floats(dbias_seed, {N});
    backend.matmul_backward({dpre, dweight, dbias, t.acts(dout, {M, N}), activated, t.acts(in[1], weight_shape),
                             layout, pre});
    return FloatInputs{t.download(dpre), subtract(t.download(dweight), dweight_seed),
                       subtract(t.download(dbias), dbias_seed)};
  };
  return op;
}

// ---- layernorm --------------------------------------------------------------------------------
OpCase layernorm_case(int64_t M, int64_t C, Rng& rng) {
  OpCase op;
  op.name = fmt::format("layernorm_M{}_C{}", M, C);
  std::vector<float> in = random_floats(static_cast<size_t>(M * C), rng, 2.0f);
  for (float& value : in) value += 0.5f;  // a non-zero mean
  op.inputs = {in, random_floats(static_cast<size_t>(C), rng), random_floats(static_cast<size_t>(C), rng)};
  op.differentiable = {0, 1, 2};
  constexpr float kEps = 1e-5f;
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({M, C});
    backend.layernorm_forward({out, t.poisoned({M}), t.poisoned({M}), t.acts(x[0], {M, C}),
                               t.acts(x[1], {C}), t.acts(x[2], {C}), kEps});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out(static_cast<size_t>(M * C));
    for (int64_t m = 0; m < M; ++m) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < C; ++c) mean += x[0][m * C + c] / static_cast<double>(C);
      for (int64_t c = 0; c < C; ++c) var += std::pow(x[0][m * C + c] - mean, 2) / static_cast<double>(C);
      for (int64_t c = 0; c < C; ++c)
        out[m * C + c] = (x[0][m * C + c] - mean) / std::sqrt(var + kEps) * x[1][c] + x[2][c];
    }
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Rng seed_rng(11);
    const std::vector<float> din_seed = rounded_to(dtype, random_floats(x[0].size(), seed_rng));  // din is "+="
    const std::vector<float> dw_seed = random_floats(static_cast<size_t>(C), seed_rng);
    const std::vector<float> db_seed = random_floats(static_cast<size_t>(C), seed_rng);
    Tensor mean = t.poisoned({M}), rstd = t.poisoned({M});
    Tensor in = t.acts(x[0], {M, C}), weight = t.acts(x[1], {C});
    backend.layernorm_forward({t.poisoned_acts({M, C}), mean, rstd, in, weight, t.acts(x[2], {C}), kEps});
    Tensor din = t.acts(din_seed, {M, C}), dw = t.floats(dw_seed, {C}), db = t.floats(db_seed, {C});
    backend.layernorm_backward({din, dw, db, t.acts(dout, {M, C}), in, weight, mean, rstd});
    return FloatInputs{subtract(t.download(din), din_seed), subtract(t.download(dw), dw_seed),
                       subtract(t.download(db), db_seed)};
  };
  return op;
}

// ---- gelu ---------------------------------------------------------------------------------------
OpCase gelu_case(int64_t count, Rng& rng) {
  OpCase op;
  op.name = fmt::format("gelu_N{}", count);
  op.inputs = {random_floats(static_cast<size_t>(count), rng, 2.0f)};
  op.differentiable = {0};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({count});
    backend.gelu_forward({out, t.acts(x[0], {count})});
    return t.download(out);
  };
  op.reference = [](const DoubleInputs& x) {
    std::vector<double> out(x[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = gelu(x[0][i]);
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Tensor din = t.poisoned_acts({count});
    backend.gelu_backward({din, t.acts(x[0], {count}), t.acts(dout, {count})});
    return FloatInputs{t.download(din)};
  };
  return op;
}

// ---- dropout ------------------------------------------------------------------------------------
// The mask is the one ops.h defines (element i kept when philox::bits(seed, stream, i) reaches
// dropout_threshold(p)); the reference scales in double. The backward is the op on dout.
OpCase dropout_case(int64_t count, float probability, Rng& rng) {
  constexpr uint64_t kSeed = 0x5eed, kStream = 77;
  OpCase op;
  op.name = fmt::format("dropout_N{}_p{}", count, static_cast<int>(probability * 100));  // p in percent
  op.inputs = {random_floats(static_cast<size_t>(count), rng, 2.0f)};
  op.differentiable = {0};
  const auto run = [=](Backend& backend, DType dtype, const std::vector<float>& in) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({count});
    backend.dropout({out, t.acts(in, {count}), probability, kSeed, kStream});
    return t.download(out);
  };
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) { return run(backend, dtype, x[0]); };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out(x[0].size());
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = philox::bits(kSeed, kStream, i) >= dropout_threshold(probability) ? x[0][i] / (1.0 - probability) : 0.0;
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs&, const std::vector<float>& dout) {
    return FloatInputs{run(backend, dtype, dout)};
  };
  return op;
}

// The residual stream's fused dropout-add: out = residual + dropout(in). Its backward: the
// dropout of dout for in, dout itself for the residual.
OpCase dropout_add_case(int64_t count, float probability, Rng& rng) {
  constexpr uint64_t kSeed = 0xadd, kStream = (uint64_t{3} << 40) + 5;
  OpCase op;
  op.name = fmt::format("dropout_add_N{}_p{}", count, static_cast<int>(probability * 100));  // p in percent
  op.inputs = {random_floats(static_cast<size_t>(count), rng, 2.0f), random_floats(static_cast<size_t>(count), rng)};
  op.differentiable = {0, 1};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({count});
    backend.dropout({out, t.acts(x[0], {count}), probability, kSeed, kStream, t.acts(x[1], {count})});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out(x[0].size());
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = x[1][i] + (philox::bits(kSeed, kStream, i) >= dropout_threshold(probability)
                              ? x[0][i] / (1.0 - probability)
                              : 0.0);
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs&, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Tensor din = t.poisoned_acts({count});
    backend.dropout({din, t.acts(dout, {count}), probability, kSeed, kStream});
    return FloatInputs{t.download(din), dout};
  };
  return op;
}

// ---- tanh -----------------------------------------------------------------------------------------
// The backward reads the forward's output (ops.h), so it runs the forward on the back-end first.
OpCase tanh_case(int64_t count, Rng& rng) {
  OpCase op;
  op.name = fmt::format("tanh_N{}", count);
  op.inputs = {random_floats(static_cast<size_t>(count), rng, 1.5f)};
  op.differentiable = {0};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({count});
    backend.tanh_forward({out, t.acts(x[0], {count})});
    return t.download(out);
  };
  op.reference = [](const DoubleInputs& x) {
    std::vector<double> out(x[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::tanh(x[0][i]);
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({count}), din = t.poisoned_acts({count});
    backend.tanh_forward({out, t.acts(x[0], {count})});
    backend.tanh_backward({din, out, t.acts(dout, {count})});
    return FloatInputs{t.download(din)};
  };
  return op;
}

// ---- gather_rows ---------------------------------------------------------------------------------
// The pooler's read of one position per sequence. The backward writes (the other rows zeroed over
// the poison); its Add is gather_rows_test.cpp's.
OpCase gather_rows_case(int64_t B, int64_t T, int64_t C, int64_t position, Rng& rng) {
  OpCase op;
  op.name = fmt::format("gather_rows_B{}_T{}_C{}_at{}", B, T, C, position);
  op.inputs = {random_floats(static_cast<size_t>(B * T * C), rng)};
  op.differentiable = {0};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({B, C});
    backend.gather_rows({out, t.acts(x[0], {B, T, C}), position});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) out.push_back(x[0][static_cast<size_t>((b * T + position) * C + c)]);
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs&, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Tensor din = t.poisoned_acts({B, T, C});
    backend.gather_rows_backward({din, t.acts(dout, {B, C}), position});
    return FloatInputs{t.download(din)};
  };
  return op;
}

// ---- mask_rows ---------------------------------------------------------------------------------------
// The encoder's final hidden states with padding zeroed; its backward is the same op on dout.
// Rows 0 and 2 and the last dropped, so a dropped row starts, sits inside and ends the tensor.
OpCase mask_rows_case(int64_t M, int64_t C, Rng& rng) {
  OpCase op;
  op.name = fmt::format("mask_rows_M{}_C{}", M, C);
  std::vector<int32_t> keep(static_cast<size_t>(M), 1);
  keep[0] = keep[2] = keep.back() = 0;
  op.inputs = {random_floats(static_cast<size_t>(M * C), rng)};
  op.differentiable = {0};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({M, C});
    backend.mask_rows({out, t.acts(x[0], {M, C}), t.ints(keep, {M})});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out(x[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = keep[i / static_cast<size_t>(C)] ? x[0][i] : 0.0;
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs&, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Tensor din = t.poisoned_acts({M, C});
    backend.mask_rows({din, t.acts(dout, {M, C}), t.ints(keep, {M})});
    return FloatInputs{t.download(din)};
  };
  return op;
}

// ---- embedding --------------------------------------------------------------------------------------
OpCase embedding_case(int64_t B, int64_t T, int64_t C, int64_t rows, int64_t positions, Rng& rng) {
  OpCase op;
  op.name = fmt::format("embedding_B{}_T{}_C{}_V{}", B, T, C, rows);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(static_cast<uint64_t>(rows)));
  tokens[0] = tokens[1] = tokens.back();  // repeated ids must accumulate in dwte
  op.inputs = {random_floats(static_cast<size_t>(rows * C), rng), random_floats(static_cast<size_t>(positions * C), rng)};
  op.differentiable = {0, 1};
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    Tensor out = t.poisoned_acts({B, T, C});
    backend.embedding_forward({out, t.ints(tokens, {B, T}), t.acts(x[0], {rows, C}), t.acts(x[1], {positions, C})});
    return t.download(out);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> out(static_cast<size_t>(B * T * C));
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t c = 0; c < C; ++c) out[i * C + c] = x[0][tokens[i] * C + c] + x[1][(i % T) * C + c];
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    Rng seed_rng(13);
    const std::vector<float> dwte_seed = random_floats(x[0].size(), seed_rng);
    const std::vector<float> dwpe_seed = random_floats(x[1].size(), seed_rng);
    Tensor dwte = t.floats(dwte_seed, {rows, C}), dwpe = t.floats(dwpe_seed, {positions, C});
    backend.embedding_backward({dwte, dwpe, t.acts(dout, {B, T, C}), t.ints(tokens, {B, T})});
    return FloatInputs{subtract(t.download(dwte), dwte_seed), subtract(t.download(dwpe), dwpe_seed)};
  };
  return op;
}

// ---- attention ----------------------------------------------------------------------------------------
const char* mask_name(AttentionMask mask) {
  switch (mask) {
    case AttentionMask::Causal: return "causal";
    case AttentionMask::KeyPadding: return "padding";
    case AttentionMask::CausalKeyPadding: return "causal_padding";
  }
  return "?";
}

// With `dropout` > 0, attention dropout on the probabilities (ops.h) under a fixed seed and stream:
// a fixed mask, so the reference is a plain function of qkv again.
OpCase attention_case(int64_t B, int64_t T, int64_t NH, int64_t HS, AttentionMask mask, Rng& rng,
                      float dropout = 0.0f) {
  const int64_t C = NH * HS;
  OpCase op;
  op.name = fmt::format("attention_{}_B{}_T{}_NH{}_HS{}", mask_name(mask), B, T, NH, HS);
  if (dropout > 0.0f) op.name += fmt::format("_dropout{}", static_cast<int>(dropout * 100));  // p in percent
  const AttentionDropout drop{dropout, 0x5eedull, 0x57ea11ull};
  const DropoutMask drop_mask = dropout_mask(dropout, drop.seed, drop.stream);
  const bool padded = mask != AttentionMask::Causal;
  const bool causal = mask != AttentionMask::KeyPadding;
  std::vector<int32_t> key_mask(static_cast<size_t>(B * T), 1);
  if (padded) {
    key_mask[0] = 0;                              // with causal: query 0 of batch 0 sees nothing
    key_mask[static_cast<size_t>(B * T - 1)] = 0; // trailing padding in the last sequence
    if (T > 3) key_mask[2] = 0;
  }
  op.inputs = {random_floats(static_cast<size_t>(B * T * 3 * C), rng)};
  op.differentiable = {0};
  // The forward's tensors; lse is checked against the reference by the backward, which needs it.
  struct Forward {
    Tensor out, lse, qkv, key_mask;
  };
  auto run_forward = [=](Backend& backend, DeviceTensors& t, const std::vector<float>& qkv_host) {
    Forward f{t.poisoned_acts({B, T, C}), t.poisoned({B * NH * T}), t.acts(qkv_host, {B, T, 3 * C}),
              padded ? t.ints(key_mask, {B, T}) : Tensor{}};
    AttentionForward forward{f.out, f.lse, f.qkv, f.key_mask, static_cast<int>(NH), mask};
    forward.dropout = drop;
    backend.attention_forward(forward);
    return f;
  };
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    DeviceTensors t(backend, dtype);
    return t.download(run_forward(backend, t, x[0]).out);
  };
  op.reference = [=](const DoubleInputs& x) {
    const std::vector<double>& qkv = x[0];
    std::vector<double> out(static_cast<size_t>(B * T * C), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < T; ++t) {
          std::vector<double> scores(static_cast<size_t>(T), -INFINITY);
          double max_score = -INFINITY;
          for (int64_t s = 0; s < T; ++s) {
            if ((causal && s > t) || (padded && key_mask[b * T + s] == 0)) continue;
            double dot = 0;
            for (int64_t d = 0; d < HS; ++d)
              dot += qkv[(b * T + t) * 3 * C + h * HS + d] * qkv[(b * T + s) * 3 * C + C + h * HS + d];
            scores[s] = dot / std::sqrt(static_cast<double>(HS));
            max_score = std::max(max_score, scores[s]);
          }
          if (max_score == -INFINITY) continue;  // no visible key: zero output
          double sum = 0;
          for (double& score : scores) sum += (score = std::exp(score - max_score));
          for (int64_t s = 0; s < T; ++s) {
            const double kept =
                dropout > 0.0f ? drop_mask.factor(static_cast<uint64_t>(((b * NH + h) * T + t) * T + s)) : 1.0;
            for (int64_t d = 0; d < HS; ++d)
              out[(b * T + t) * C + h * HS + d] +=
                  scores[s] / sum * kept * qkv[(b * T + s) * 3 * C + 2 * C + h * HS + d];
          }
        }
    return out;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    DeviceTensors t(backend, dtype);
    const Forward f = run_forward(backend, t, x[0]);
    Tensor dqkv = t.poisoned_acts({B, T, 3 * C});
    AttentionBackward backward{dqkv, t.acts(dout, {B, T, C}), f.qkv, f.out, f.lse, f.key_mask, static_cast<int>(NH),
                               mask};
    backward.dropout = drop;
    backend.attention_backward(backward);
    return FloatInputs{t.download(dqkv)};
  };
  return op;
}

// ---- softmax + cross-entropy ------------------------------------------------------------------------------
OpCase cross_entropy_case(int64_t M, int64_t V, int64_t Vp, Rng& rng) {
  OpCase op;
  op.name = fmt::format("cross_entropy_M{}_V{}_Vp{}", M, V, Vp);
  constexpr int32_t kIgnore = -100;
  std::vector<int32_t> targets(static_cast<size_t>(M));
  for (int32_t& target : targets) target = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  targets[1] = kIgnore;
  op.inputs = {random_floats(static_cast<size_t>(M * Vp), rng, 3.0f)};
  op.differentiable = {0};
  op.uniform_dout = true;
  auto run = [=](Backend& backend, DType dtype, const std::vector<float>& logits_host, bool grad, float scale,
                 std::vector<float>* logits_after) {
    DeviceTensors t(backend, dtype);
    Tensor logits = t.acts(logits_host, {M, Vp});
    Tensor losses = t.poisoned({M});
    backend.softmax_cross_entropy({logits, losses, t.ints(targets, {M}), V, kIgnore, scale, grad});
    if (logits_after) *logits_after = t.download(logits);
    return t.download(losses);
  };
  op.forward = [=](Backend& backend, DType dtype, const FloatInputs& x) {
    return run(backend, dtype, x[0], false, 1.0f, nullptr);
  };
  op.reference = [=](const DoubleInputs& x) {
    std::vector<double> losses(static_cast<size_t>(M), 0.0);
    for (int64_t m = 0; m < M; ++m) {
      if (targets[m] == kIgnore) continue;
      double max_logit = -INFINITY, sum = 0;
      for (int64_t v = 0; v < V; ++v) max_logit = std::max(max_logit, x[0][m * Vp + v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(x[0][m * Vp + v] - max_logit);
      losses[m] = std::log(sum) + max_logit - x[0][m * Vp + targets[m]];
    }
    return losses;
  };
  op.backward = [=](Backend& backend, DType dtype, const FloatInputs& x, const std::vector<float>& dout) {
    std::vector<float> grad;
    run(backend, dtype, x[0], true, dout[0], &grad);
    return FloatInputs{grad};
  };
  return op;
}

}  // namespace

std::vector<OpCase> all_op_cases() {
  Rng rng(20240520);
  std::vector<OpCase> cases;
  cases.push_back(matmul_case(7, 24, 80, true, WeightLayout::InOut, rng));
  cases.push_back(matmul_case(16, 64, 48, false, WeightLayout::InOut, rng));
  cases.push_back(matmul_case(3, 5, 1, true, WeightLayout::InOut, rng));
  cases.push_back(matmul_case(5, 24, 13, false, WeightLayout::OutIn, rng));
  cases.push_back(matmul_case(9, 80, 33, true, WeightLayout::OutIn, rng));
  // Multiples of 8 take cuBLASLt's GELU epilogues on CUDA; the others the separate GELU kernels.
  cases.push_back(matmul_residual_case(16, 48, 64, true, WeightLayout::InOut, rng));
  cases.push_back(matmul_residual_case(5, 24, 13, false, WeightLayout::OutIn, rng));
  cases.push_back(matmul_gelu_case(7, 24, 64, rng));
  cases.push_back(matmul_gelu_case(5, 16, 20, rng));
  cases.push_back(gelu_matmul_case(6, 32, 24, WeightLayout::InOut, rng));
  cases.push_back(gelu_matmul_case(3, 12, 8, WeightLayout::InOut, rng));
  cases.push_back(gelu_matmul_case(5, 16, 24, WeightLayout::OutIn, rng));
  cases.push_back(layernorm_case(6, 24, rng));
  cases.push_back(layernorm_case(3, 80, rng));
  cases.push_back(layernorm_case(4, 7, rng));
  cases.push_back(layernorm_case(1030, 4, rng));  // CUDA's backward in 33 runs of rows, the last short
  cases.push_back(layernorm_case(2, 2056, rng));  // CUDA's backward in two slices of columns, 2048 and 8
  cases.push_back(gelu_case(37, rng));
  cases.push_back(gelu_case(256, rng));
  cases.push_back(dropout_case(37, 0.25f, rng));   // one element at a time on CUDA
  cases.push_back(dropout_case(256, 0.5f, rng));   // packs of elements
  cases.push_back(dropout_add_case(37, 0.1f, rng));
  cases.push_back(dropout_add_case(512, 0.3f, rng));
  cases.push_back(embedding_case(2, 5, 24, 13, 8, rng));
  cases.push_back(embedding_case(1, 7, 80, 64, 7, rng));
  // CUDA's token-gradient kernel stages a run's rows 256 at a time and its columns 1024 at a time:
  // runs of about 300 rows (two tokens over 600 positions), and a row wider than 1024.
  cases.push_back(embedding_case(3, 200, 8, 2, 200, rng));
  cases.push_back(embedding_case(1, 3, 1100, 4, 3, rng));
  cases.push_back(attention_case(2, 5, 2, 24, AttentionMask::Causal, rng));
  cases.push_back(attention_case(1, 7, 1, 80, AttentionMask::Causal, rng));
  cases.push_back(attention_case(2, 4, 4, 4, AttentionMask::Causal, rng));
  cases.push_back(attention_case(3, 9, 2, 8, AttentionMask::Causal, rng));
  cases.push_back(attention_case(2, 6, 1, 24, AttentionMask::KeyPadding, rng));
  cases.push_back(attention_case(2, 6, 2, 8, AttentionMask::CausalKeyPadding, rng));
  // GPT-2's head size 64, 128 (larger models) and 256 (the largest the CUDA issue asks for).
  cases.push_back(attention_case(1, 9, 2, 64, AttentionMask::Causal, rng));
  cases.push_back(attention_case(1, 7, 1, 128, AttentionMask::CausalKeyPadding, rng));
  cases.push_back(attention_case(1, 5, 1, 256, AttentionMask::Causal, rng));
  cases.push_back(cross_entropy_case(5, 11, 64, rng));
  cases.push_back(cross_entropy_case(3, 257, 320, rng));
  cases.push_back(
      cross_entropy_case(4, 19, 21, rng));  // rows of an odd length: CUDA's element-wise path
  // Appended, so the cases above keep their random inputs. tanh of 37 elements takes CUDA's
  // one-element path, 256 its packs; the rows of 24 and 80 channels move in packs.
  cases.push_back(tanh_case(37, rng));
  cases.push_back(tanh_case(256, rng));
  cases.push_back(gather_rows_case(3, 5, 24, 0, rng));
  cases.push_back(gather_rows_case(2, 7, 80, 3, rng));
  // The encoder's bidirectional attention under key padding at its head sizes, and attention
  // dropout (masks drawn the same on every back-end) at two rates, causal and padded.
  cases.push_back(attention_case(2, 9, 2, 64, AttentionMask::KeyPadding, rng));
  cases.push_back(attention_case(2, 7, 1, 80, AttentionMask::KeyPadding, rng));
  cases.push_back(attention_case(1, 9, 1, 128, AttentionMask::KeyPadding, rng));
  cases.push_back(attention_case(2, 9, 2, 24, AttentionMask::Causal, rng, 0.1f));
  cases.push_back(attention_case(2, 9, 2, 64, AttentionMask::KeyPadding, rng, 0.3f));
  cases.push_back(attention_case(1, 7, 1, 80, AttentionMask::CausalKeyPadding, rng, 0.3f));
  // Rows of an odd width (CUDA's one-element path) and of packs.
  cases.push_back(mask_rows_case(5, 7, rng));
  cases.push_back(mask_rows_case(6, 24, rng));
  return cases;
}

}  // namespace kiln::testing
