// OpTimingBackend forwards every op unchanged and counts each under its op name and shape.
#include "kiln/backend/op_timing.h"

#include <gtest/gtest.h>

#include "kiln/backend/registry.h"
#include "support/device_tensors.h"

namespace kiln::testing {
namespace {

TEST(OpTiming, ForwardsOpsAndTimesEachByNameAndShape) {
  OpTimingBackend timing(make_backend("cpu"));
  std::unique_ptr<Backend> plain = make_backend("cpu");
  Rng rng(3);
  const std::vector<float> in = random_floats(4 * 3, rng), weight = random_floats(3 * 6, rng);
  auto product = [&](Backend& backend) {
    DeviceTensors t(backend);
    Tensor out = t.poisoned({4, 6}), activated = t.poisoned({4, 6});
    backend.matmul_forward({out, t.floats(in, {4, 3}), t.floats(weight, {3, 6}), t.floats(std::vector<float>(6, 0.5f), {6}),
                            WeightLayout::InOut, activated});
    return t.download(activated);
  };
  EXPECT_EQ(product(timing), product(*plain));
  product(timing);
  DeviceTensors t(timing);
  timing.fill({t.poisoned({8}), 1.0f});

  const std::vector<OpTimingBackend::OpTime> times = timing.times();
  ASSERT_EQ(times.size(), 4u);  // the products, fill, and DeviceTensors' uploads and downloads
  auto find = [&](const std::string& op) {
    for (const auto& time : times)
      if (time.op == op) return time;
    ADD_FAILURE() << op << " not timed";
    return OpTimingBackend::OpTime{};
  };
  EXPECT_EQ(find("matmul_forward 4x3x6 +bias +gelu").calls, 2);
  EXPECT_GT(find("matmul_forward 4x3x6 +bias +gelu").total_ms, 0.0);
  EXPECT_EQ(find("fill").calls, 1);
  EXPECT_EQ(find("copy_to_host").calls, 2);  // both products' downloads (the plain back-end's are not timed)
  EXPECT_NE(OpTimingBackend::format(times).find("matmul_forward 4x3x6 +bias +gelu"), std::string::npos);
  timing.reset_times();
  EXPECT_TRUE(timing.times().empty());
}

}  // namespace
}  // namespace kiln::testing
