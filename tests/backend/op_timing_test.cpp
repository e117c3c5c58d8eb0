// OpTimingBackend forwards every op unchanged and counts each under its op name and shape, with
// the work it did: FLOPs for products, bytes moved for every op.
#include "kiln/backend/op_timing.h"

#include <gtest/gtest.h>

#include <sstream>

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

  const std::vector<OpTotals> times = timing.times();
  ASSERT_EQ(times.size(), 4u);  // the products, fill, and DeviceTensors' uploads and downloads
  auto find = [&](const std::string& op) {
    for (const auto& time : times)
      if (time.op == op) return time;
    ADD_FAILURE() << op << " not timed";
    return OpTotals{};
  };
  EXPECT_EQ(find("matmul_forward 4x3x6 +bias +gelu").calls, 2);
  EXPECT_GT(find("matmul_forward 4x3x6 +bias +gelu").total_ms, 0.0);
  // 2 M K N FLOPs per product; bytes: out, in, weight, bias and the GELU output, fp32.
  EXPECT_EQ(find("matmul_forward 4x3x6 +bias +gelu").flops, 2 * (2.0 * 4 * 3 * 6));
  EXPECT_EQ(find("matmul_forward 4x3x6 +bias +gelu").bytes, 2 * 4.0 * (24 + 12 + 18 + 6 + 24));
  EXPECT_EQ(find("fill").calls, 1);
  EXPECT_EQ(find("fill").flops, 0.0);
  EXPECT_EQ(find("fill").bytes, 8 * 4.0);
  EXPECT_EQ(find("copy_to_host").calls, 2);  // both products' downloads (the plain back-end's are not timed)
  const std::string table = OpTimingBackend::format(times);
  EXPECT_NE(table.find("matmul_forward 4x3x6 +bias +gelu"), std::string::npos);
  EXPECT_NE(table.find("TFLOP/s"), std::string::npos);  // the product's rate
  EXPECT_NE(table.find("GB/s"), std::string::npos);     // fill's
  // Against limits of 1e-9 TFLOP/s and 1e-6 GB/s every op's bound is far longer than its time:
  // each row but the copies' gets a share of its roofline.
  const DeviceLimits slow{1e-9, 1e-9, 1e-6};
  const std::string against_limits = OpTimingBackend::format(times, &slow);
  EXPECT_NE(against_limits.find("of roofline"), std::string::npos);
  std::istringstream rows(against_limits);
  int shares = 0;
  for (std::string row; std::getline(rows, row);) {
    if (row.starts_with("copy_to_")) {
      EXPECT_FALSE(row.ends_with("%")) << row;
    } else if (row.starts_with("matmul_forward") || row.starts_with("fill")) {
      EXPECT_TRUE(row.ends_with("%")) << row;
      ++shares;
    }
  }
  EXPECT_EQ(shares, 2);
  timing.reset_times();
  EXPECT_TRUE(timing.times().empty());
}

// The device work a back-end timed inside an op's calls (Backend::take_launch_times; the CPU's
// has none) adds up by name across the calls, most time first, and prints under the op.
TEST(OpTiming, AddsUpTheDeviceWorkInsideAnOpByName) {
  OpLedger ledger;
  const OpWork product{.op = "matmul_forward 8x8x8 +gelu codes fp8", .flops = 1024.0};
  ledger.add(product, 2.0, {{"cuBLASLt product", 0.5}, {"cast_fp8_kernel<bf16, (Fp8Source)1>", 1.0},
                            {"cuBLASLt product", 0.25}});
  ledger.add(product, 1.0, {{"cast_fp8_kernel<bf16, (Fp8Source)1>", 0.5}});
  const std::vector<OpTotals> times = ledger.totals();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times[0].calls, 2);
  ASSERT_EQ(times[0].launches.size(), 2u);
  EXPECT_EQ(times[0].launches[0].what, "cast_fp8_kernel<bf16, (Fp8Source)1>");  // 1.5 ms: most first
  EXPECT_EQ(times[0].launches[0].launches, 2);
  EXPECT_DOUBLE_EQ(times[0].launches[0].total_ms, 1.5);
  EXPECT_EQ(times[0].launches[1].launches, 2);
  EXPECT_DOUBLE_EQ(times[0].launches[1].total_ms, 0.75);
  // Indented under the op: launches, total ms, ms per op call, share of the op's 3 ms.
  const std::string table = OpTimingBackend::format(times);
  EXPECT_NE(table.find("\n  cast_fp8_kernel<bf16, (Fp8Source)1>"), std::string::npos) << table;
  EXPECT_NE(table.find("2       1.500      0.7500   50.0% of the op"), std::string::npos) << table;
  EXPECT_NE(table.find("2       0.750      0.3750   25.0% of the op"), std::string::npos) << table;
  OpTimingBackend cpu(make_backend("cpu"));
  DeviceTensors t(cpu);
  cpu.fill({t.poisoned({8}), 1.0f});
  for (const OpTotals& time : cpu.times()) EXPECT_TRUE(time.launches.empty()) << time.op;
}

TEST(OpTiming, CountsAttentionAndBackwardProductsWork) {
  OpTimingBackend timing(make_backend("cpu"));
  Rng rng(5);
  DeviceTensors t(timing);
  constexpr int64_t B = 1, T = 4, C = 8, NH = 2;
  const Tensor qkv = t.floats(random_floats(B * T * 3 * C, rng), {B, T, 3 * C});
  const Tensor out = t.poisoned({B, T, C}), lse = t.poisoned({B * NH * T});
  timing.attention_forward({out, lse, qkv, Tensor{}, static_cast<int>(NH), AttentionMask::Causal});
  const Tensor dqkv = t.poisoned({B, T, 3 * C});
  timing.attention_backward({dqkv, t.floats(random_floats(B * T * C, rng), {B, T, C}), qkv, out, lse, Tensor{},
                             static_cast<int>(NH), AttentionMask::Causal});
  // A product's backward: both gradients (4 M K N), then the weight gradient alone (2 M K N).
  const Tensor in = t.floats(random_floats(3 * 5, rng), {3, 5}), weight = t.floats(random_floats(5 * 2, rng), {5, 2});
  const Tensor dout = t.floats(random_floats(3 * 2, rng), {3, 2}), dweight = t.floats(std::vector<float>(10, 0.0f), {5, 2});
  timing.matmul_backward({t.poisoned({3, 5}), dweight, Tensor{}, dout, in, weight, WeightLayout::InOut});
  timing.matmul_backward({Tensor{}, dweight, Tensor{}, dout, in, weight, WeightLayout::InOut});

  double attention_forward = -1, attention_backward = -1, product_backward = -1;
  for (const auto& time : timing.times()) {
    if (time.op.starts_with("attention_forward")) attention_forward = time.flops;
    if (time.op.starts_with("attention_backward")) attention_backward = time.flops;
    if (time.op.starts_with("matmul_backward")) product_backward = time.flops;
  }
  EXPECT_EQ(attention_forward, 4.0 * B * T * T * C / 2);  // causal: half the scores
  EXPECT_EQ(attention_backward, 2.5 * attention_forward);
  EXPECT_EQ(product_backward, 4.0 * 3 * 5 * 2 + 2.0 * 3 * 5 * 2);
}

}  // namespace
}  // namespace kiln::testing
