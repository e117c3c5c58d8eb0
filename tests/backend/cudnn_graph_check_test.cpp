// Whether the cuDNN installed here takes kiln's attention graphs (cudnn_attention_graphs.h) for an
// H100, asked without one: cuDNN 9.8+ plans for a GPU it is given a description of
// (cudnn_device.h). An engine that passes its graph checks answers Success, or, on a machine without
// the CUDA driver, lacks only that runtime prerequisite. The emulator's cuDNN stand-in interprets
// the same graphs on the CPU and checks their arithmetic (Cuda/LongAttention); this checks that the
// real library recognises them as the fused flash-attention patterns its engines serve.
//
// Runs in CUDA builds where libcudnn.so.9 (9.8 or later) loads; skipped, saying why, elsewhere.
#if defined(KILN_WITH_CUDA)

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "kiln/backend/cuda/cudnn_attention_graphs.h"
#include "kiln/backend/cuda/cudnn_device.h"
#include "kiln/core/error.h"
#include "support/backends.h"
#include "support/error_of.h"

namespace {

using kiln::cuda::CudnnAttentionShape;
using kiln::cudnn::DataType;
using kiln::cudnn::DeviceProperties;
using kiln::cudnn::OperationGraph;
using kiln::cudnn::PointwiseMode;

// An H100 SXM5 80GB HBM3 as cuDNN 9.19 reads one. The members are those cuDNN requires (it names
// each missing one); the values are cudaDeviceProp's for that GPU from NVIDIA's H100 datasheet and
// CUDA's device query: 132 SMs, 227 KiB of shared memory a block may opt into, 50 MiB of L2, sm_90
// (deviceVer 900), driver for CUDA 13.0. A GPU's own description is DeviceProperties::of(handle).json().
constexpr const char* kH100Description = R"({
  "maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536,
  "multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
  "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
  "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 8976, "isTccDriver": 0,
  "supportCoopLaunch": 1, "totalGlobalMem": 85520809984, "smClockRateKHz": 1980000, "memClockRateKHz": 2619000,
  "l2CacheSize": 52428800, "cudaDeviceId": 0, "deviceVer": 900, "driverVer": 13000,
  "deviceName": "NVIDIA H100 80GB HBM3"})";

// Empty where the cuDNN here can describe a GPU, else why not.
std::string skip_reason() {
  try {
    const kiln::cudnn::Library& library = kiln::cudnn::library();
    if (!kiln::cudnn::describes_devices(library))
      return "cuDNN " + library.version_text() + " (" + library.path + ") cannot describe a GPU (needs 9.8)";
    return "";
  } catch (const kiln::Error& error) {
    return error.what();
  }
}

bool some_engine_takes(const std::vector<kiln::cudnn::EngineAnswer>& answers) {
  return std::any_of(answers.begin(), answers.end(),
                     [](const auto& answer) { return kiln::cudnn::passes_graph_checks(answer.status); });
}

class CudnnGraphCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

// (backward, causal, bf16, head size)
class CudnnGraphCheckOfAttention : public CudnnGraphCheck,
                                   public ::testing::WithParamInterface<std::tuple<bool, bool, bool, int>> {};

// "backward_causal_bf16_HS64"
std::string graph_name(const ::testing::TestParamInfo<std::tuple<bool, bool, bool, int>>& info) {
  const auto [backward, causal, bf16, head_size] = info.param;
  return std::string(backward ? "backward" : "forward") + (causal ? "_causal" : "") + (bf16 ? "_bf16" : "_fp16") +
         "_HS" + std::to_string(head_size);
}

TEST_P(CudnnGraphCheckOfAttention, SomeEngineTakesTheGraphForAnH100) {
  const auto [backward, causal, bf16, head_size] = GetParam();
  const CudnnAttentionShape shape{4, 1024, 768 / head_size, head_size, bf16, causal};
  const auto described = backward ? kiln::cuda::cudnn_attention_backward_graph(shape)
                                  : kiln::cuda::cudnn_attention_forward_graph(shape);
  const auto answers =
      kiln::cudnn::engine_answers(described.graph, DeviceProperties::from_json(kH100Description, "the test's H100"));
  EXPECT_TRUE(some_engine_takes(answers)) << kiln::cuda::cudnn_attention_name(shape, backward) << ": "
                                          << kiln::cudnn::describe_answers(answers);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnGraphCheckOfAttention,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(64, 128)),
                         graph_name);

// The shapes bench/device-check.sh trains (GPT-2 124M, 350M and 774M at their micro-batches, bf16,
// causal), forward and backward.
TEST_F(CudnnGraphCheck, SomeEngineTakesTheBenchmarkShapes) {
  const DeviceProperties h100 = DeviceProperties::from_json(kH100Description, "the test's H100");
  for (const auto& [batch, heads] : {std::pair<int64_t, int64_t>{64, 12}, {32, 16}, {16, 20}}) {
    const CudnnAttentionShape shape{batch, 1024, heads, 64, true, true};
    for (const bool backward : {false, true}) {
      const auto described = backward ? kiln::cuda::cudnn_attention_backward_graph(shape)
                                      : kiln::cuda::cudnn_attention_forward_graph(shape);
      const auto answers = kiln::cudnn::engine_answers(described.graph, h100);
      EXPECT_TRUE(some_engine_takes(answers)) << kiln::cuda::cudnn_attention_name(shape, backward) << ": "
                                              << kiln::cudnn::describe_answers(answers);
    }
  }
}

// The check can fail: scores exponentiated without softmax's running maximum and sum are no fused
// attention pattern, and no engine takes them.
TEST_F(CudnnGraphCheck, AGraphThatIsNotAttentionIsTakenByNoEngine) {
  const int64_t B = 4, NH = 12, T = 1024, HS = 64;
  OperationGraph graph("scores exponentiated, then applied");
  const auto rows = [&](DataType type) {
    return kiln::cudnn::TensorLayout{{B, NH, T, HS}, {NH * T * HS, T * HS, HS, 1}, type};
  };
  const auto scores = [&](DataType type) {
    return kiln::cudnn::TensorLayout{{B, NH, T, T}, {NH * T * T, T * T, T, 1}, type};
  };
  const auto q = graph.memory_tensor(rows(DataType::BFloat16));
  const auto k = graph.memory_tensor({{B, NH, HS, T}, {NH * T * HS, T * HS, 1, HS}, DataType::BFloat16});
  const auto v = graph.memory_tensor(rows(DataType::BFloat16));
  const auto s = graph.virtual_tensor(scores(DataType::Float));
  graph.matmul(q, k, s);
  const auto p = graph.virtual_tensor(scores(DataType::BFloat16));
  graph.pointwise(PointwiseMode::Exp, {s}, p);
  graph.matmul(p, v, graph.memory_tensor(rows(DataType::BFloat16)));
  const auto answers =
      kiln::cudnn::engine_answers(graph, DeviceProperties::from_json(kH100Description, "the test's H100"));
  EXPECT_FALSE(answers.empty());
  EXPECT_FALSE(some_engine_takes(answers)) << kiln::cudnn::describe_answers(answers);
  // what a plan no engine takes reports (OperationGraph::build): each engine by index, with its status
  const std::string described = kiln::cudnn::describe_answers(answers);
  EXPECT_EQ(described.rfind("engine 0: CUDNN_STATUS_", 0), 0u) << described;
  EXPECT_NE(described.find("; engine " + std::to_string(answers.size() - 1) + ": CUDNN_STATUS_"), std::string::npos)
      << described;
}

TEST_F(CudnnGraphCheck, ADescriptionRoundTripsThroughItsJson) {
  const DeviceProperties h100 = DeviceProperties::from_json(kH100Description, "the test's H100");
  const std::string json = h100.json();
  EXPECT_NE(json.find("\"multiProcessorCount\""), std::string::npos) << json;
  EXPECT_NE(json.find("132"), std::string::npos) << json;
  EXPECT_EQ(DeviceProperties::from_json(json, "its own JSON").json(), json);
}

TEST_F(CudnnGraphCheck, ADescriptionCudnnRefusesIsNamedWithItsReason) {
  const std::string lacking = R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64]})";
  const std::string message = kiln::testing::error_of([&] { DeviceProperties::from_json(lacking, "gpu.json"); });
  EXPECT_NE(message.find("cuDNN refuses the GPU description in gpu.json: CUDNN_STATUS_"), std::string::npos)
      << message;
}

// Where a GPU is, cuDNN describes it, and an engine builds kiln's graphs for it outright. The
// description is printed: it is what kH100Description stands in for.
TEST_F(CudnnGraphCheck, ThisGpuIsDescribedAndAnEngineTakesTheGraphsForIt) {
  const std::string no_gpu = kiln::testing::backend_skip_reason("cuda");
  if (!no_gpu.empty()) GTEST_SKIP() << no_gpu;
  kiln::cudnn::Handle handle = nullptr;
  kiln::cudnn::check(kiln::cudnn::library().create(&handle), "cudnnCreate");
  const DeviceProperties here = DeviceProperties::of(handle);
  std::cout << "this GPU, as cuDNN describes it: " << here.json() << "\n";
  for (const bool backward : {false, true}) {
    const CudnnAttentionShape shape{4, 1024, 12, 64, true, true};
    const auto described = backward ? kiln::cuda::cudnn_attention_backward_graph(shape)
                                    : kiln::cuda::cudnn_attention_forward_graph(shape);
    const auto answers = kiln::cudnn::engine_answers(described.graph, here);
    EXPECT_TRUE(std::any_of(answers.begin(), answers.end(), [](const auto& answer) { return answer.status == 0; }))
        << kiln::cudnn::describe_answers(answers);
  }
  kiln::cudnn::library().destroy(handle);
}

}  // namespace

#endif  // KILN_WITH_CUDA
