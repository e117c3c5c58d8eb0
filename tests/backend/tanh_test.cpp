// tanh on every back-end (ops.h): in place (out aliasing in, din aliasing dout) gives the very bits
// of the op into another tensor, in every compute dtype, on the one-element path and in packs.
// The values against the reference are the op table's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/backend/registry.h"
#include "support/backends.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

class Tanh : public OnEachBackend {};

TEST_P(Tanh, InPlaceGivesTheSameBitsAsIntoAnotherTensor) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t count : {37, 256}) {
      SCOPED_TRACE(fmt::format("{} N {}", dtype_name(dtype), count));
      Rng rng(11);
      const std::vector<float> in = random_floats(static_cast<size_t>(count), rng, 2.0f);
      const std::vector<float> dout = random_floats(static_cast<size_t>(count), rng);
      DeviceTensors t(*backend_, dtype);
      Tensor out = t.poisoned_acts({count}), din = t.poisoned_acts({count});
      backend_->tanh_forward({out, t.acts(in, {count})});
      backend_->tanh_backward({din, out, t.acts(dout, {count})});

      Tensor x = t.acts(in, {count});
      backend_->tanh_forward({x, x});
      EXPECT_EQ(t.download(x), t.download(out));
      Tensor g = t.acts(dout, {count});
      backend_->tanh_backward({g, x, g});
      EXPECT_EQ(t.download(g), t.download(din));
    }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Tanh, ::testing::ValuesIn(all_backend_names()), backend_param_name);

}  // namespace
}  // namespace kiln::testing
