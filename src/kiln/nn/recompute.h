// Activation recomputation policy, with Megatron-LM's semantics (Korthikanti et al. 2022,
// arXiv 2205.05198), and the per-layer plan the activation layout and Gpt::backward follow.
//
//   none                 every block keeps all its activations
//   full, uniform, N     layers in chunks of N; only each chunk's input is kept, and the chunk's
//                        forward is re-run (into N shared scratch slots) just before its backward
//   full, block, N       the first N layers are each recomputed from their own input; the rest
//                        keep everything
//   selective            recompute what takes memory but little arithmetic (Megatron's idea):
//                        the core attention's B x NH x T x T probabilities, which kiln's attention
//                        op never keeps in any mode (ops.h), and the MLP's GELU output (4C per
//                        token per layer, the largest activation): every layer's GELU output
//                        shares one buffer and is recomputed from the kept pre-activation just
//                        before that layer's backward, one elementwise pass per layer.
// Recomputation replays the same deterministic ops, so gradients are bit for bit those of the
// run without it (tested on the CPU, and on CUDA in fp32). One exception: on CUDA in bf16/fp16 the
// forward applies GELU inside the product (cuBLASLt epilogue) before rounding the pre-activation,
// and selective recomputes it from the rounded one, so they differ by the dtype's rounding. Not
// deterministic attention on CUDA (--no-deterministic-attention) rounds dQ differently every run,
// recomputed or not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

enum class RecomputeGranularity { None, Full, Selective };
enum class RecomputeMethod { Uniform, Block };

struct RecomputePolicy {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int64_t num_layers = 1;

  // From config strings: granularity "none" | "full" | "selective", method "uniform" | "block".
  static RecomputePolicy parse(const std::string& granularity, const std::string& method, int64_t num_layers);
  std::string describe() const;
};

struct LayerRecompute {
  bool recomputed = false;   // full granularity: forward re-run before backward
  bool gelu_recomputed = false;  // selective: GELU output recomputed before backward (shared buffer)
  int64_t scratch_slot = 0;  // which shared BlockActivations a recomputed layer uses
  int64_t chunk_first = 0;   // first layer of this layer's recompute chunk
  int64_t chunk_last = 0;    // last layer of the chunk; its output is kept (the next chunk's input)
};

// One entry per layer. Errors name the config key when the policy does not fit the model.
std::vector<LayerRecompute> plan_recompute(const RecomputePolicy& policy, int64_t layers);
int64_t recompute_scratch_slots(const std::vector<LayerRecompute>& plan);

}  // namespace kiln
