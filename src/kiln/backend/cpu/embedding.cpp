// Token + learned position embedding. The backward scatters into dwte by token id; to stay
// deterministic without atomics, threads own disjoint channel ranges and walk positions in order.
#include "kiln/backend/op_checks.h"
#include "kiln/backend/cpu/cpu_backend.h"

namespace kiln {

namespace {
void embedding_forward_fp32(const EmbeddingForward& args) {
  const auto [B, T, C] = checks::embedding_forward(args, Device::CPU);
  const int64_t rows = args.wte.shape[0];
  const int32_t* tokens = args.tokens.as<int32_t>();
  for (int64_t i = 0; i < B * T; ++i)
    KILN_CHECK(tokens[i] >= 0 && tokens[i] < rows, "embedding_forward: token id {} at position {} is outside [0, {})",
               tokens[i], i, rows);
  const float* wte = args.wte.as<float>();
  const float* wpe = args.wpe.as<float>();
  float* out = args.out.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* token_row = wte + tokens[i] * C;
    const float* position_row = wpe + (i % T) * C;
    float* out_row = out + i * C;
    for (int64_t c = 0; c < C; ++c) out_row[c] = token_row[c] + position_row[c];
  }
}
}  // namespace

void CpuBackend::embedding_forward(const EmbeddingForward& args) {
  checks::embedding_forward(args, Device::CPU);
  Fp32Scope f(scratch_);
  embedding_forward_fp32({f.output(args.out), args.tokens, f.input(args.wte), f.input(args.wpe)});
  f.write_back();
}

namespace {
void embedding_backward_fp32(const EmbeddingBackward& args) {
  const auto [B, T, C] = checks::embedding_backward(args, Device::CPU);
  const int32_t* tokens = args.tokens.as<int32_t>();
  const float* dout = args.dout.as<float>();
  float* dwte = args.dwte.as<float>();
  float* dwpe = args.dwpe.as<float>();
  constexpr int64_t kChannelBlock = 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kChannelBlock) {
    const int64_t c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < B * T; ++i) {
      const float* grad_row = dout + i * C;
      float* token_row = dwte + tokens[i] * C;
      float* position_row = dwpe + (i % T) * C;
      for (int64_t c = c0; c < c1; ++c) {
        token_row[c] += grad_row[c];
        position_row[c] += grad_row[c];
      }
    }
  }
}
}  // namespace

void CpuBackend::embedding_backward(const EmbeddingBackward& args) {
  checks::embedding_backward(args, Device::CPU);
  zero_to_write(args.dwpe_store, {args.dwpe});
  Fp32Scope f(scratch_);
  embedding_backward_fp32({args.dwte, args.dwpe, f.input(args.dout), args.tokens});
  f.write_back();
}

}  // namespace kiln
