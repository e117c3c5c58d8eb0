#include "kiln/nn/fp8_scaling.h"

#include "kiln/core/error.h"
#include "kiln/core/fp8_codec.h"

namespace kiln {
namespace {

constexpr int64_t kProductsPerBlock = 4, kOperandsPerProduct = 3;  // in, weight, dout

int64_t state_rows(int64_t layers) { return layers * kProductsPerBlock * kOperandsPerProduct; }

}  // namespace

size_t Fp8Scaling::state_bytes(int64_t layers, int64_t amax_history) {
  return static_cast<size_t>(state_rows(layers) * (kFp8StateColumns + amax_history)) * sizeof(float);
}

Fp8Scaling::Fp8Scaling(Backend& backend, int64_t layers, const Fp8Recipe& recipe)
    : backend_(backend), recipe_(recipe) {
  KILN_CHECK(recipe.amax_history >= 1, "the fp8 amax history must hold at least 1 step, not {}",
             recipe.amax_history);
  KILN_CHECK(recipe.grad_dtype == DType::F8E5M2 || recipe.grad_dtype == DType::F8E4M3,
             "fp8 gradients are fp8_e5m2 or fp8_e4m3, not {}", dtype_name(recipe.grad_dtype));
  const int64_t rows = state_rows(layers), columns = kFp8StateColumns + recipe.amax_history;
  buffer_ = backend.allocate(state_bytes(layers, recipe.amax_history));
  state_ = Tensor{buffer_->data(), Shape{rows, columns}, DType::F32, backend.device()};
  std::vector<float> initial(static_cast<size_t>(rows * columns), 0.0f);
  const auto largest = [](DType format) {
    return fp8::largest(format == DType::F8E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2);
  };
  for (int64_t row = 0; row < rows; ++row) {
    float* r = initial.data() + row * columns;
    r[0] = r[1] = 1.0f;  // scale, scale_inv
    r[3] = largest(row % kOperandsPerProduct == 2 ? recipe.grad_dtype : DType::F8E4M3);
  }
  backend.copy_to_device(state_.data, initial.data(), initial.size() * sizeof(float));

  const auto view = [&](int64_t row, int64_t column) {
    return state_.slice(row * columns + column, 1);
  };
  const auto operand = [&](int64_t row) {
    return Fp8Operand{view(row, 0), view(row, 1), view(row, 2)};
  };
  const auto product = [&](int64_t first_row) {
    return Fp8Matmul{operand(first_row), operand(first_row + 1), operand(first_row + 2),
                     recipe.grad_dtype};
  };
  for (int64_t layer = 0; layer < layers; ++layer) {  // rows: layer, product, operand
    const int64_t row = layer * kProductsPerBlock * kOperandsPerProduct;
    blocks_.push_back({product(row), product(row + 3), product(row + 6), product(row + 9)});
  }
}

void Fp8Scaling::update_scales(int64_t step) {
  KILN_CHECK(step >= 0, "fp8 scale update for step {}", step);
  backend_.fp8_update_scales(
      {state_, step % recipe_.amax_history, recipe_.use_history_max, recipe_.margin});
}

void Fp8Scaling::load_state(std::span<const float> values) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == state_.numel(),
             "{} fp8 scaling values given, the state holds {}", values.size(), state_.numel());
  backend_.copy_to_device(state_.data, values.data(), values.size() * sizeof(float));
}

}  // namespace kiln
