#include "kiln/nn/fp8_scaling.h"

#include <algorithm>
#include <cstdint>

#include "kiln/core/error.h"
#include "kiln/core/fp8_codec.h"

namespace kiln {
namespace {

constexpr int64_t kProductsPerBlock = 4, kOperandsPerProduct = 3;  // in, weight, dout
// In memory (fp8_scaling.h): rows a whole number of 16-byte units, starting 3 floats into a 16-byte
// aligned allocation, so that column 1 (scale_inv) is 16-byte aligned in every row.
constexpr int64_t kRowUnitFloats = 4, kLeadFloats = 3;

int64_t state_rows(int64_t layers, const Fp8Recipe& recipe) {
  return (layers * kProductsPerBlock + (recipe.classifier ? 1 : 0)) * kOperandsPerProduct;
}
int64_t row_floats(int64_t amax_history) {
  return (kFp8StateColumns + amax_history + kRowUnitFloats - 1) / kRowUnitFloats * kRowUnitFloats;
}

}  // namespace

size_t Fp8Scaling::state_bytes(int64_t layers, const Fp8Recipe& recipe) {
  const int64_t floats = kLeadFloats + state_rows(layers, recipe) * row_floats(recipe.amax_history);
  return static_cast<size_t>((floats + kRowUnitFloats - 1) / kRowUnitFloats * kRowUnitFloats) * sizeof(float);
}

Fp8Scaling::Fp8Scaling(Backend& backend, int64_t layers, const Fp8Recipe& recipe)
    : backend_(backend), recipe_(recipe) {
  KILN_CHECK(recipe.amax_history >= 1, "the fp8 amax history must hold at least 1 step, not {}",
             recipe.amax_history);
  KILN_CHECK(recipe.grad_dtype == DType::F8E5M2 || recipe.grad_dtype == DType::F8E4M3,
             "fp8 gradients are fp8_e5m2 or fp8_e4m3, not {}", dtype_name(recipe.grad_dtype));
  const int64_t rows = state_rows(layers, recipe), columns = row_floats(recipe.amax_history);
  buffer_bytes_ = state_bytes(layers, recipe);
  buffer_ = backend.allocate(buffer_bytes_);
  KILN_CHECK(reinterpret_cast<uintptr_t>(buffer_->data()) % (kRowUnitFloats * sizeof(float)) == 0,
             "the fp8 scaling state's allocation is not 16-byte aligned");
  state_ = Tensor{static_cast<float*>(buffer_->data()) + kLeadFloats, Shape{rows, columns}, DType::F32,
                  backend.device()};
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
  if (recipe.classifier) classifier_ = product(layers * kProductsPerBlock * kOperandsPerProduct);  // the last rows
}

void Fp8Scaling::update_scales(int64_t step) {
  KILN_CHECK(step >= 0, "fp8 scale update for step {}", step);
  backend_.fp8_update_scales(
      {state_, step % recipe_.amax_history, recipe_.use_history_max, recipe_.margin});
}

Shape Fp8Scaling::saved_shape() const { return Shape{state_.shape[0], kFp8StateColumns + recipe_.amax_history}; }

std::vector<float> Fp8Scaling::saved_state() const {
  std::vector<float> rows(static_cast<size_t>(state_.numel()));
  backend_.copy_to_host(rows.data(), state_.data, state_.bytes());
  const int64_t saved_columns = saved_shape()[1], columns = state_.shape[1];
  std::vector<float> saved(static_cast<size_t>(saved_shape().numel()));
  for (int64_t row = 0; row < state_.shape[0]; ++row)
    std::copy_n(rows.begin() + row * columns, saved_columns, saved.begin() + row * saved_columns);
  return saved;
}

void Fp8Scaling::load_state(std::span<const float> values) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == saved_shape().numel(),
             "{} fp8 scaling values given, the state holds {}", values.size(), saved_shape().numel());
  const int64_t saved_columns = saved_shape()[1], columns = state_.shape[1];
  std::vector<float> rows(static_cast<size_t>(state_.numel()), 0.0f);  // the extra history slots: 0
  for (int64_t row = 0; row < state_.shape[0]; ++row)
    std::copy_n(values.begin() + row * saved_columns, saved_columns, rows.begin() + row * columns);
  backend_.copy_to_device(state_.data, rows.data(), state_.bytes());
}

}  // namespace kiln
