// Fp8Scaling (nn/fp8_scaling.h) on every back-end: every operand's scale_inv is 16-byte aligned in
// the back-end's memory whatever the amax history (cuBLASLt's fp8 factors), the classifier's rows
// included where it is fp8; the history slots the rows gain for that never take part in a scale;
// checkpoints see the recipe's layout.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kiln/backend/registry.h"
#include "kiln/nn/fp8_scaling.h"
#include "support/backends.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

class Fp8ScalingState : public OnEachBackend {};

Fp8Recipe history_max(int64_t steps) { return {DType::F8E5M2, 0, steps, /*use_history_max=*/true}; }

TEST_P(Fp8ScalingState, EveryScaleInverseIs16ByteAligned) {
  for (const bool classifier : {false, true}) {
    for (const int64_t steps : {1, 2, 3, 4, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << "history " << steps << (classifier ? ", classifier fp8" : ""));
      Fp8Recipe recipe = history_max(steps);
      recipe.classifier = classifier;
      const Fp8Scaling scaling(*backend_, 3, recipe);
      std::vector<const Fp8Matmul*> products;
      for (int64_t layer = 0; layer < 3; ++layer) {
        const BlockFp8& block = scaling.block(layer);
        products.insert(products.end(), {&block.qkv, &block.attn_proj, &block.fc, &block.fc_proj});
      }
      ASSERT_EQ(scaling.classifier() != nullptr, classifier);
      if (classifier) products.push_back(scaling.classifier());
      for (const Fp8Matmul* product : products)
        for (const Fp8Operand* operand : {&product->in, &product->weight, &product->dout})
          EXPECT_EQ(reinterpret_cast<uintptr_t>(operand->scale_inv.data) % 16, 0u);
      const int64_t rows = classifier ? 39 : 36;  // 3 layers x 4 products (+ the classifier) x 3 operands
      EXPECT_EQ(scaling.saved_shape(), Shape({rows, kFp8StateColumns + steps}));
      EXPECT_EQ(scaling.state().shape[0], rows);
      EXPECT_GE(scaling.state().shape[1], kFp8StateColumns + steps);
      EXPECT_EQ(scaling.state().shape[1] % 4, 0) << "rows of whole 16-byte units";
      EXPECT_LE(scaling.state().bytes() + 3 * sizeof(float), scaling.bytes());
      EXPECT_EQ(scaling.bytes(), Fp8Scaling::state_bytes(3, recipe));
      if (!classifier) continue;
      // The classifier's rows are the last three: in and weight E4M3, the gradient E5M2.
      const auto row_of = [&](const Tensor& view) {
        return (static_cast<const float*>(view.data) - static_cast<const float*>(scaling.state().data)) /
               scaling.state().shape[1];
      };
      EXPECT_EQ(row_of(scaling.classifier()->in.scale), 36);
      EXPECT_EQ(row_of(scaling.classifier()->dout.amax), 38);
      const std::vector<float> saved = scaling.saved_state();
      EXPECT_EQ(saved[static_cast<size_t>(38 * (kFp8StateColumns + steps) + 3)], 57344.0f);
    }
  }
}

// With a history of 2 steps ("max"), an amax of 8 seen at step 0 counts at steps 0 and 1 and is gone
// at step 2, whose update writes slot 0 again: the padded slots 2 and 3 hold nothing.
TEST_P(Fp8ScalingState, TheHistoryMaximumSpansTheRecipesSteps) {
  Fp8Scaling scaling(*backend_, 1, history_max(2));
  const int64_t columns = kFp8StateColumns + 2;
  const auto scale_of_row = [&](int64_t row) { return scaling.saved_state()[static_cast<size_t>(row * columns)]; };
  const auto set_amax = [&](float amax) {
    std::vector<float> values = scaling.saved_state();
    for (int64_t row = 0; row < 12; ++row) values[static_cast<size_t>(row * columns + 2)] = amax;
    scaling.load_state(values);
  };
  // Row 0 is a block input (E4M3, largest 448), row 2 an output gradient (E5M2, 57344).
  set_amax(8.0f);
  scaling.update_scales(0);
  EXPECT_EQ(scale_of_row(0), 448.0f / 8);
  EXPECT_EQ(scale_of_row(2), 57344.0f / 8);
  set_amax(2.0f);
  scaling.update_scales(1);
  EXPECT_EQ(scale_of_row(0), 448.0f / 8) << "8 is still in the history";
  set_amax(1.0f);
  scaling.update_scales(2);
  EXPECT_EQ(scale_of_row(0), 448.0f / 2) << "8 has left the 2-step history";
  const std::vector<float> saved = scaling.saved_state();
  EXPECT_EQ(saved[kFp8StateColumns], 1.0f);      // slot 0, written by step 2
  EXPECT_EQ(saved[kFp8StateColumns + 1], 2.0f);  // slot 1, by step 1
}

TEST_P(Fp8ScalingState, LoadStateTakesTheSavedLayout) {
  Fp8Scaling scaling(*backend_, 2, history_max(3));
  std::vector<float> values(static_cast<size_t>(scaling.saved_shape().numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f + static_cast<float>(i);
  scaling.load_state(values);
  EXPECT_EQ(scaling.saved_state(), values);
  values.pop_back();
  EXPECT_NE(error_of([&] { scaling.load_state(values); }).find("167 fp8 scaling values given, the state holds 168"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Fp8ScalingState, ::testing::ValuesIn(all_backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace kiln::testing
