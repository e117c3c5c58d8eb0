#include "kiln/backend/op_counting.h"

#include "kiln/backend/op_checks.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr size_t kAlignment = 256;

class CountedBuffer final : public DeviceBuffer {
 public:
  CountedBuffer(void* address, size_t bytes, std::shared_ptr<MemoryTracker> memory)
      : address_(address), bytes_(bytes), memory_(std::move(memory)) {
    memory_->allocated(bytes_);
  }
  ~CountedBuffer() override { memory_->freed(bytes_); }
  void* data() const override { return address_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* address_;
  size_t bytes_;
  std::shared_ptr<MemoryTracker> memory_;
};

}  // namespace

std::unique_ptr<DeviceBuffer> OpCountingBackend::allocate(size_t bytes) {
  void* address = reinterpret_cast<void*>(next_address_);
  next_address_ += (bytes + kAlignment - 1) / kAlignment * kAlignment + kAlignment;
  return std::make_unique<CountedBuffer>(address, bytes, memory_);
}

std::unique_ptr<BatchStager> OpCountingBackend::make_batch_stager(const StagerOptions&) {
  fail("the op counter stages no batches: it runs no training, only counts the ops of one");
}

double OpCountingBackend::time_gemm_ms(DType, bool, int64_t, int64_t, int64_t, int) {
  fail("the op counter times nothing: measure the GEMM ceiling with --device cuda");
}

void OpCountingBackend::embedding_forward(const EmbeddingForward& a) {
  count(a, checks::embedding_forward);
}
void OpCountingBackend::embedding_backward(const EmbeddingBackward& a) {
  count(a, checks::embedding_backward);
}
void OpCountingBackend::layernorm_forward(const LayerNormForward& a) {
  count(a, checks::layernorm_forward);
}
void OpCountingBackend::layernorm_backward(const LayerNormBackward& a) {
  count(a, checks::layernorm_backward);
}
void OpCountingBackend::matmul_forward(const MatmulForward& a) { count(a, checks::matmul_forward); }
void OpCountingBackend::matmul_backward(const MatmulBackward& a) {
  count(a, checks::matmul_backward);
}
void OpCountingBackend::gelu_forward(const GeluForward& a) { count(a, checks::gelu_forward); }
void OpCountingBackend::gelu_backward(const GeluBackward& a) { count(a, checks::gelu_backward); }
void OpCountingBackend::tanh_forward(const TanhForward& a) { count(a, checks::tanh_forward); }
void OpCountingBackend::tanh_backward(const TanhBackward& a) { count(a, checks::tanh_backward); }
void OpCountingBackend::gather_rows(const GatherRows& a) { count(a, checks::gather_rows); }
void OpCountingBackend::gather_rows_backward(const GatherRowsBackward& a) {
  count(a, checks::gather_rows_backward);
}
void OpCountingBackend::mask_rows(const MaskRows& a) { count(a, checks::mask_rows); }
void OpCountingBackend::attention_forward(const AttentionForward& a) {
  count(a, checks::attention_forward);
}
void OpCountingBackend::attention_backward(const AttentionBackward& a) {
  count(a, checks::attention_backward);
}
void OpCountingBackend::softmax_cross_entropy(const SoftmaxCrossEntropy& a) {
  count(a, checks::softmax_cross_entropy);
}
void OpCountingBackend::adamw_step(const AdamwStep& a) { count(a, checks::adamw_step); }
void OpCountingBackend::fp8_update_scales(const Fp8UpdateScales& a) {
  count(a, checks::fp8_update_scales);
}
void OpCountingBackend::dropout(const Dropout& a) { count(a, checks::dropout); }
void OpCountingBackend::fill(const Fill& a) { count(a, checks::fill); }
void OpCountingBackend::convert(const Convert& a) { count(a, checks::convert); }
double OpCountingBackend::sum_of_squares(const SumOfSquares& a) {
  count(a, checks::sum_of_squares);
  return 0.0;
}

}  // namespace kiln
