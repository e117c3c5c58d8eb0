// EmbeddingLookups: data parallelism's early reduction of the tied embedding's gradient
// (TiedEmbedding::defer_embedding_lookup, nn/model.h). GPT's embedding is tied to its classifier, so its gradient is
// only final at the very end of the backward, when the token lookup adds to it: as the largest
// tensor of a small model (GPT-2 124M: 31% of the parameters), it is the bucket the backward cannot
// hide. So the last micro-batch's backward leaves the lookup out, the embedding's bucket is
// reduced while the blocks' backward runs, and afterwards every rank gathers every rank's lookup
// inputs (the gradient at the embedding's output and the tokens, a few rows) and adds them in rank
// order: every rank ends with the same bits, the sum over the ranks of the whole gradient.
//
// Use per step: start() after the last micro-batch's backward (before its host tokens are
// reused), then, once the embedding's bucket is reduced, add_to(). Every rank calls both (the
// Communicator's contract). The buffers are allocated once, at construction.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kiln/backend/backend.h"
#include "kiln/dist/communicator.h"
#include "kiln/nn/model.h"

namespace kiln {

class EmbeddingLookups {
 public:
  // Whether deferring pays: the lookups gathered from `ranks` ranks are fewer bytes than the
  // embedding's gradient (wte and wpe, fp32), which the deferral lets the backward hide.
  static bool worthwhile(const TiedEmbedding& embedding, int64_t micro_batch, int64_t seq, DType compute, int ranks);

  EmbeddingLookups(Backend& backend, Communicator& communicator, int64_t micro_batch, int64_t seq, int64_t hidden,
                   DType compute);

  // This rank's lookup inputs (the model's embedding_output_gradient(), `tokens` on the host) into
  // its slots, and the gathers of every rank's started.
  void start(const TiedEmbedding& model, std::span<const int32_t> tokens);
  // Waits for the gathers and adds every rank's lookup to the model's gradients, rank 0's first.
  void add_to(TiedEmbedding& model);

 private:
  Backend& backend_;
  Communicator& communicator_;
  int64_t micro_batch_, seq_, hidden_;
  DType compute_;
  std::unique_ptr<DeviceBuffer> gradients_, tokens_;  // [ranks, B, T, C] compute dtype; [ranks, B, T] int32
  std::unique_ptr<CommWork> gradients_gather_, tokens_gather_;

  Tensor all_gradients() const;
  Tensor all_tokens() const;
  Tensor gradients_of(int rank) const;
  Tensor tokens_of(int rank) const;
};

}  // namespace kiln
