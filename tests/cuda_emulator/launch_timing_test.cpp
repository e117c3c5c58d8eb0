// --profile-ops on the CUDA back-end splits each op into the device work inside it
// (cuda/launch_timing.h): kernels by name, cuBLASLt's products and cuDNN's attention calls by
// label, each timed between two events. On the emulator kernels have no names (its
// cudaFuncGetName gives none), so the names are checked on mangled names nvcc gave kiln's kernels.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "kiln/backend/cuda/launch_timing.h"
#include "kiln/backend/op_timing.h"
#include "kiln/train/trainer.h"
#include "support/recorded_runs.h"
#include "support/small_gpt.h"

namespace kiln::testing {
namespace {

TEST(KernelDisplayName, DropsTheReturnTypeNamespacesAndParameters) {
  // From `nvcc -ptx` of fp8.cu and layernorm_fp8.cu (nvcc 13.0): their .entry names.
  EXPECT_EQ(cuda::kernel_display_name("_ZN4kiln4cuda38_GLOBAL__N__9b88eefb_6_fp8_cu_93df9eed15cast_fp8_kernelI13__nv_"
                                      "bfloat16LNS1_9Fp8SourceE0EEEvPKT_S7_llPKfPfbPhSB_SA_"),
            "cast_fp8_kernel<bf16, (Fp8Source)0>");
  EXPECT_EQ(cuda::kernel_display_name("_ZN4kiln4cuda49_GLOBAL__N__2f374fb1_16_layernorm_fp8_cu_8fbbda0f33layernorm_"
                                      "forward_fp8_rows_kernelIfLi4ELi1EEEvPhS3_PfS4_PKT_S7_S7_llfPKfS4_"),
            "layernorm_forward_fp8_rows_kernel<float, 4, 1>");
  // A name CUDA gives already demangled is shortened alike; one that is no C++ name stays.
  EXPECT_EQ(cuda::kernel_display_name("void kiln::cuda::(anonymous namespace)::fill_kernel<__half>(__half*, long)"),
            "fill_kernel<fp16>");
  EXPECT_EQ(cuda::kernel_display_name("plain_c_kernel"), "plain_c_kernel");
}

const OpTotals& op_containing(const std::vector<OpTotals>& times, const std::string& part) {
  for (const OpTotals& time : times)
    if (time.op.find(part) != std::string::npos) return time;
  throw std::runtime_error("no op with '" + part + "'");
}

std::map<std::string, int64_t> launches_of(const OpTotals& op) {
  std::map<std::string, int64_t> launches;
  for (const LaunchTotals& launch : op.launches) launches[launch.what] = launch.launches;
  return launches;
}

// The device check's fastest setting, one profiled step: fp8 products, the classifier's too, cuDNN's
// attention.
TEST(EmulatedLaunchTiming, AProfiledStepListsTheWorkInsideEachOp) {
  TempDir dir;
  write_toy_dataset(dir.path(), 61, 20000, 2000);
  Config config = small_gpt_config(dir.path(), "cuda");
  config.bf16 = true;
  config.fp8_format = "hybrid";
  config.fp8_classifier = true;
  config.cudnn_attention = true;
  config.profile_ops = true;
  {
    Trainer trainer(config);
    EXPECT_TRUE(cuda::launch_timing());
    trainer.train_step();
    const std::vector<OpTotals> times = trainer.op_timing()->times();
    const std::string kernel = "a kernel (no name from CUDA)";
    // c_fc's forward: the product, and the kernels around it (the cast of its GELU output among them).
    const OpTotals& c_fc = op_containing(times, "+gelu codes fp8");
    EXPECT_EQ(launches_of(c_fc).size(), 2u);
    EXPECT_EQ(launches_of(c_fc).at("cuBLASLt product"), c_fc.calls);
    EXPECT_GE(launches_of(c_fc).at(kernel), c_fc.calls);
    // cuDNN's attention, and in the backward the casts of dQKV that c_attn's fp8 backward reads.
    const OpTotals& forward = op_containing(times, "attention_forward");
    EXPECT_EQ(launches_of(forward).at("cuDNN attention forward"), forward.calls);
    const OpTotals& backward = op_containing(times, "attention_backward");
    EXPECT_EQ(launches_of(backward).at("cuDNN attention backward"), backward.calls);
    EXPECT_GE(launches_of(backward).at(kernel), backward.calls);
    // The fp8 LayerNorm's backward: its kernel, then the last pass of its column sums (dweight
    // and dbias, then the product's bias gradient).
    const OpTotals& layernorm = op_containing(times, "layernorm_backward fp8");
    EXPECT_EQ(launches_of(layernorm), (std::map<std::string, int64_t>{{kernel, 3 * layernorm.calls}}));
    for (const OpTotals& op : times) {
      double inside = 0.0;
      for (const LaunchTotals& launch : op.launches) inside += launch.total_ms;
      EXPECT_LE(inside, op.total_ms * 1.001 + 1e-3) << op.op << ": device work longer than the op";
      EXPECT_NE(op.launches.empty(), !op.host_copy) << op.op << ": device work listed only for device ops";
    }
    const std::string table = OpTimingBackend::format(times);
    EXPECT_NE(table.find("\n  cuBLASLt product"), std::string::npos) << table;
    EXPECT_NE(table.find("% of the op"), std::string::npos) << table;
  }
  EXPECT_FALSE(cuda::launch_timing()) << "the profile's end turns the timing off";
}

}  // namespace
}  // namespace kiln::testing
