#include "kiln/train/embedding_lookups.h"

#include <utility>

#include "kiln/core/error.h"

namespace kiln {

bool EmbeddingLookups::worthwhile(const TiedEmbedding& embedding_model, int64_t micro_batch, int64_t seq,
                                  DType compute, int ranks) {
  const auto positions = static_cast<double>(ranks) * static_cast<double>(micro_batch * seq);
  const double gathered =
      positions * static_cast<double>(embedding_model.embedding_width() * static_cast<int64_t>(dtype_size(compute)) +
                                      static_cast<int64_t>(sizeof(int32_t)));
  const double embedding =
      static_cast<double>(embedding_model.embedding_gradients_end()) * static_cast<double>(sizeof(float));
  return gathered < embedding;
}

EmbeddingLookups::EmbeddingLookups(Backend& backend, Communicator& communicator, int64_t micro_batch, int64_t seq,
                                   int64_t hidden, DType compute)
    : backend_(backend),
      communicator_(communicator),
      micro_batch_(micro_batch),
      seq_(seq),
      hidden_(hidden),
      compute_(compute) {
  const auto ranks = static_cast<size_t>(communicator.world_size());
  const auto positions = static_cast<size_t>(micro_batch * seq);
  gradients_ = backend.allocate(ranks * positions * static_cast<size_t>(hidden) * dtype_size(compute));
  tokens_ = backend.allocate(ranks * positions * sizeof(int32_t));
}

Tensor EmbeddingLookups::all_gradients() const {
  return {gradients_->data(), Shape{communicator_.world_size() * micro_batch_ * seq_ * hidden_}, compute_,
          backend_.device()};
}

Tensor EmbeddingLookups::all_tokens() const {
  return {tokens_->data(), Shape{communicator_.world_size() * micro_batch_ * seq_}, DType::I32, backend_.device()};
}

Tensor EmbeddingLookups::gradients_of(int rank) const {
  const int64_t count = micro_batch_ * seq_ * hidden_;
  return all_gradients().slice(rank * count, count).reshaped({micro_batch_, seq_, hidden_});
}

Tensor EmbeddingLookups::tokens_of(int rank) const {
  const int64_t count = micro_batch_ * seq_;
  return all_tokens().slice(rank * count, count).reshaped({micro_batch_, seq_});
}

void EmbeddingLookups::start(const TiedEmbedding& model, std::span<const int32_t> tokens) {
  const int rank = communicator_.rank();
  const Tensor own_tokens = tokens_of(rank);
  KILN_CHECK(static_cast<int64_t>(tokens.size()) == own_tokens.numel(),
             "embedding lookups: {} tokens for a micro-batch of {}", tokens.size(), own_tokens.numel());
  backend_.convert({gradients_of(rank), model.embedding_output_gradient()});
  backend_.copy_to_device(own_tokens.data, tokens.data(), own_tokens.bytes());
  gradients_gather_ = communicator_.all_gather(all_gradients());
  tokens_gather_ = communicator_.all_gather(all_tokens());
}

void EmbeddingLookups::add_to(TiedEmbedding& model) {
  std::exchange(gradients_gather_, nullptr)->wait();
  std::exchange(tokens_gather_, nullptr)->wait();
  for (int rank = 0; rank < communicator_.world_size(); ++rank)
    model.add_embedding_lookup(gradients_of(rank), tokens_of(rank));
}

}  // namespace kiln
