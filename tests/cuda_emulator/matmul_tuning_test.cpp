// cuda::LtMatmul choosing each plan's cuBLASLt algorithm by timing (autotune, lt_matmul_tuning.h),
// on the emulator's cuBLASLt with several algorithms of set costs
// (cuda_emulator::set_cublaslt_algorithms): the fastest is kept and runs every later call; a call
// that running again would change (accumulating into its output) is never timed in place, so it
// runs exactly once and adds its product once; refused algorithms are passed over; nothing is
// timed inside a CUDA graph's capture; and without autotune only the heuristic's first runs. Also
// the two decisions on their own (which candidate to keep, which products repeat exactly), and
// whole training runs, whose every product (epilogues, accumulation over micro-batches, fp8, CUDA
// graphs, and the device check's verdict setting with cuDNN's attention) must come out bit for bit as
// without timing or graphs, the emulator's algorithms computing alike.
#include <cuda_runtime.h>  // the emulator's
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "device_memory.h"
#include "kiln/backend/cuda/lt_matmul.h"
#include "kiln/backend/cuda/lt_matmul_tuning.h"
#include "kiln/backend/cuda/stream.h"
#include "kiln/core/error.h"
#include "support/recorded_runs.h"
#include "support/small_gpt.h"

namespace kiln::testing {
namespace {

constexpr int64_t M = 8, N = 12, K = 16;
constexpr float kRefused = std::numeric_limits<float>::infinity();

TEST(MatmulTuningChoice, KeepsTheHeuristicsFirstUnlessAnotherIsFasterByMoreThanTheMargin) {
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{1.0f, 0.99f, 1.2f}, 0.02f), 0u);  // within 2%
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{1.0f, 0.97f, 0.9f}, 0.02f), 2u);  // the fastest
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{1.0f, 2.0f}, 0.02f), 0u);
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{0.5f}, 0.02f), 0u);
}

TEST(MatmulTuningChoice, TakesTheFastestThatRanWhenTheFirstWasRefusedAndNoneWhenNoneRan) {
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{kRefused, 3.0f, 2.0f}, 0.02f), 2u);
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{kRefused, kRefused}, 0.02f), std::nullopt);
  EXPECT_EQ(cuda::chosen_candidate(std::vector<float>{}, 0.02f), std::nullopt);
}

// Products over made-up addresses (only their bytes' extents matter here): C [M,N] fp32 written at
// 0x100000, A [M,K] and B [K,N] bf16 read from 0x10000 and 0x20000.
cuda::Gemm product_at_addresses() {
  cuda::Gemm g;
  g.types = {DType::BF16, DType::F32};
  g.M = M, g.N = N, g.K = K;
  g.A = reinterpret_cast<const void*>(uintptr_t{0x10000}), g.lda = K;
  g.B = reinterpret_cast<const void*>(uintptr_t{0x20000}), g.ldb = N;
  g.C = reinterpret_cast<void*>(uintptr_t{0x100000}), g.ldc = N;
  return g;
}
void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

TEST(MatmulTuningRepeats, AProductWritingApartFromItsInputsRepeatsAndOneAccumulatingDoesNot) {
  cuda::Gemm g = product_at_addresses();
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.beta = 1.0f;  // C += A B
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g.addend = address(0x200000);  // C = A B + addend
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.addend = g.C;
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
}

TEST(MatmulTuningRepeats, OverlapIsTakenFromEachMatrixsLastByte) {
  cuda::Gemm g = product_at_addresses();
  // A [M,K] bf16 with row stride K spans (M - 1) K + K elements: 256 bytes.
  g.C = address(0x10000 + 2 * (M * K) - 4);  // C's first element on A's last two
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g.C = address(0x10000 + 2 * (M * K));  // just past A
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.trans_a = true, g.lda = M;  // A stored [K,M]: the same bytes
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.lda = M + 8;  // a wider row stride reaches further
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
}

TEST(MatmulTuningRepeats, EpiloguesAndFactorsCountAsReadsOrWrites) {
  cuda::Gemm g = product_at_addresses();
  g.epilogue = cuda::GemmEpilogue::Dgelu;  // reads aux
  g.aux = g.C, g.aux_ld = N;
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g.aux = address(0x300000);
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.epilogue = cuda::GemmEpilogue::GeluAuxBias;  // writes aux, reads the bias
  g.aux = const_cast<void*>(g.B);
  g.bias = address(0x400000);
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g.aux = address(0x300000);
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.bias = g.C;
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g = product_at_addresses();
  g.epilogue = cuda::GemmEpilogue::BiasGradFromB;  // writes the bias gradient
  g.bias_grad = const_cast<void*>(g.A);
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
  g.bias_grad = address(0x500000);
  EXPECT_TRUE(cuda::product_repeats_exactly(g));
  g.a_scale = static_cast<const float*>(g.C);  // an fp8 factor inside the output
  EXPECT_FALSE(cuda::product_repeats_exactly(g));
}

// fp32 C [M,N] = A [M,K] B [K,N] (+ C when accumulating) on real buffers, with small integers, so
// every product is exact and a second accumulation would show.
class EmulatedMatmulTuning : public ::testing::Test {
 protected:
  EmulatedMatmulTuning() {
    for (int64_t i = 0; i < M * K; ++i) a[static_cast<size_t>(i)] = static_cast<float>(i % 7 - 3);
    for (int64_t i = 0; i < K * N; ++i) b[static_cast<size_t>(i)] = static_cast<float>(i % 5 - 2);
    EXPECT_EQ(cudaMemcpy(a_device.data, a.data(), a.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(b_device.data, b.data(), b.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void TearDown() override { cuda_emulator::set_cublaslt_algorithms({}); }

  cuda::Gemm product(float beta = 0.0f) const {
    cuda::Gemm g;
    g.M = M, g.N = N, g.K = K;
    g.A = a_device.data, g.lda = K;
    g.B = b_device.data, g.ldb = N;
    g.C = c_device.data, g.ldc = N;
    g.beta = beta;
    return g;
  }
  void set_c(float value) {
    const std::vector<float> c(M * N, value);
    ASSERT_EQ(cudaMemcpy(c_device.data, c.data(), c.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  // Waits for the products, then checks C = `times` A B + `start`.
  void expect_c(float start, int times = 1) const {
    std::vector<float> c(M * N);
    ASSERT_EQ(cudaStreamSynchronize(cuda::compute_stream()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(c.data(), c_device.data, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float expected = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          expected += a[static_cast<size_t>(m * K + k)] * b[static_cast<size_t>(k * N + n)];
        EXPECT_EQ(c[static_cast<size_t>(m * N + n)], start + static_cast<float>(times) * expected)
            << "C[" << m << ", " << n << "]";
      }
  }
  static std::vector<int64_t> runs() { return cuda_emulator::cublaslt_runs_by_algorithm(); }
  // Runs per algorithm that timing them costs: a warm-up and kTuningRounds timed runs each.
  static constexpr int64_t kTimingRuns = 1 + cuda::LtMatmul::kTuningRounds;

  DeviceMemory workspace{cuda::LtMatmul::kWorkspaceBytes};
  DeviceMemory a_device{M * K * 4}, b_device{K * N * 4}, c_device{M * N * 4}, d_device{M * N * 4};
  std::vector<float> a = std::vector<float>(M * K), b = std::vector<float>(K * N);
};

TEST_F(EmulatedMatmulTuning, KeepsTheFastestAlgorithmForEveryLaterCall) {
  cuda_emulator::set_cublaslt_algorithms({30.0, 0.0, 60.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  set_c(NAN);
  ASSERT_TRUE(lt.run(product()));
  expect_c(0.0f);
  EXPECT_EQ(runs(), (std::vector<int64_t>{kTimingRuns, kTimingRuns + 1, kTimingRuns}));
  ASSERT_TRUE(lt.run(product()));
  ASSERT_TRUE(lt.run(product(1.0f)));  // the same plan (beta is the call's), accumulating once
  expect_c(0.0f, 2);
  EXPECT_EQ(runs(), (std::vector<int64_t>{kTimingRuns, kTimingRuns + 3, kTimingRuns}));
  const cuda::LtMatmul::PlanCounts counts = lt.plan_counts();
  EXPECT_EQ(counts.timed, 1);
  EXPECT_EQ(counts.changed, 1);
  EXPECT_GT(counts.best_speedup, 10.0);  // 30 ms against well under 3
}

TEST_F(EmulatedMatmulTuning, KeepsTheHeuristicsFirstWhenItIsFastest) {
  cuda_emulator::set_cublaslt_algorithms({0.0, 20.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  ASSERT_TRUE(lt.run(product()));
  ASSERT_TRUE(lt.run(product()));
  expect_c(0.0f);
  EXPECT_EQ(runs(), (std::vector<int64_t>{kTimingRuns + 2, kTimingRuns}));
  EXPECT_EQ(lt.plan_counts().timed, 1);
  EXPECT_EQ(lt.plan_counts().changed, 0);
}

TEST_F(EmulatedMatmulTuning, WithoutAutotuneOnlyTheHeuristicsFirstRuns) {
  cuda_emulator::set_cublaslt_algorithms({20.0, 0.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes);
  ASSERT_TRUE(lt.run(product()));
  ASSERT_TRUE(lt.run(product()));
  expect_c(0.0f);
  EXPECT_EQ(runs(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(lt.plan_counts().timed, 0);
}

TEST_F(EmulatedMatmulTuning, AnAccumulatingCallIsNotTimedInPlaceAndAddsItsProductOnce) {
  cuda_emulator::set_cublaslt_algorithms({20.0, 0.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  set_c(0.5f);
  ASSERT_TRUE(lt.run(product(1.0f)));  // C += A B: timing it in place would add it again and again
  expect_c(0.5f);
  EXPECT_EQ(runs(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(lt.plan_counts().timed, 0);
  cuda::Gemm apart = product(1.0f);  // C read from an addend: repeats exactly, so timed now
  apart.addend = c_device.data;
  apart.C = d_device.data;
  ASSERT_TRUE(lt.run(apart));
  ASSERT_EQ(cudaStreamSynchronize(cuda::compute_stream()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(c_device.data, d_device.data, M * N * 4, cudaMemcpyDeviceToDevice), cudaSuccess);
  expect_c(0.5f, 2);
  EXPECT_EQ(runs(), (std::vector<int64_t>{1 + kTimingRuns, kTimingRuns + 1}));
  EXPECT_EQ(lt.plan_counts().timed, 1);
}

TEST_F(EmulatedMatmulTuning, PassesOverAlgorithmsRefusedWhenRun) {
  cuda_emulator::set_cublaslt_algorithms({-1.0, 10.0, 0.0});  // the heuristic's first refused
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  set_c(NAN);
  ASSERT_TRUE(lt.run(product()));
  expect_c(0.0f);
  EXPECT_EQ(runs(), (std::vector<int64_t>{0, kTimingRuns, kTimingRuns + 1}));
  EXPECT_EQ(lt.plan_counts().changed, 1);
}

TEST_F(EmulatedMatmulTuning, WhenEveryAlgorithmIsRefusedAnEpilogueFallsBackAndAPlainProductFails) {
  cuda_emulator::set_cublaslt_algorithms({-1.0, -1.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  DeviceMemory bias(N * 4);
  cuda::Gemm biased = product();
  biased.epilogue = cuda::GemmEpilogue::Bias;
  biased.bias = bias.data;
  EXPECT_FALSE(lt.run(biased));  // the caller adds the bias itself
  EXPECT_FALSE(lt.run(biased));
  EXPECT_EQ(lt.plan_counts().fell_back, 1);
  EXPECT_THROW(lt.run(product()), Error);
}

TEST_F(EmulatedMatmulTuning, APlanFirstMetInsideAGraphCaptureIsTimedAfterIt) {
  cuda_emulator::set_cublaslt_algorithms({20.0, 0.0});
  cuda::LtMatmul lt(workspace.data, cuda::LtMatmul::kWorkspaceBytes, true);
  const cudaStream_t stream = cuda::compute_stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_TRUE(lt.run(product()));  // a wait for timing here would invalidate the capture
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);  // not invalidated
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(runs(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(lt.plan_counts().timed, 0);
  cudaGraphDestroy(graph);
  set_c(NAN);
  ASSERT_TRUE(lt.run(product()));
  expect_c(0.0f);
  EXPECT_EQ(lt.plan_counts().timed, 1);
  EXPECT_EQ(runs(), (std::vector<int64_t>{1 + kTimingRuns, kTimingRuns + 1}));
}

// bf16 with accumulation over two micro-batches, then with fp8 products replayed from CUDA graphs.
TEST(EmulatedMatmulTuningInTraining, ChangesNoBitOfARun) {
  TempDir dir;
  write_toy_dataset(dir.path(), 61, 20000, 2000);
  for (const bool fp8_and_graphs : {false, true}) {
    Config config = small_gpt_config(dir.path(), "cuda");
    config.bf16 = true;
    config.train_iters = 4;
    if (fp8_and_graphs) {
      config.fp8_format = "hybrid";
      config.cuda_graph = true;
    }
    cuda_emulator::set_cublaslt_algorithms({});
    const std::vector<IterationStats> untimed = train_and_record(config);
    cuda_emulator::set_cublaslt_algorithms({3.0, 0.0});  // the heuristic's first the slower
    config.matmul_autotune = true;
    Trainer trainer(config);
    IterationRecorder recorder;
    trainer.add_observer(&recorder);
    trainer.run();
    expect_resumed_bit_for_bit(recorder.iterations, untimed, 0);
    const std::string notes = trainer.backend().run_notes();
    EXPECT_NE(notes.find("algorithms timed for"), std::string::npos) << notes;
    const std::vector<int64_t> runs = cuda_emulator::cublaslt_runs_by_algorithm();
    // Timing runs each algorithm 4 times a plan; after it, only the faster one.
    EXPECT_GT(runs[1], 2 * runs[0]) << "fp8 and graphs: " << fp8_and_graphs;
  }
  cuda_emulator::set_cublaslt_algorithms({});
}

// The device check's verdict setting (bench/device-check.sh, `fastest`): fp8 products, the
// classifier's too, attention on cuDNN's engines (the emulator's stand-in), the loss in chunks and
// every product's algorithm timed; replayed from CUDA graphs, the run is bit for bit the direct one.
TEST(EmulatedMatmulTuningInTraining, TheFastestSettingReplaysFromGraphsBitForBit) {
  TempDir dir;
  write_toy_dataset(dir.path(), 61, 20000, 2000);
  Config config = small_gpt_config(dir.path(), "cuda");
  config.bf16 = true;
  config.train_iters = 4;
  config.fp8_format = "hybrid";
  config.fp8_classifier = true;
  config.cudnn_attention = true;
  config.loss_chunk_rows = 48;  // 128 positions a micro-batch: chunks of 48, 48 and 32
  config.matmul_autotune = true;
  cuda_emulator::set_cublaslt_algorithms({3.0, 0.0});
  const std::vector<IterationStats> direct = train_and_record(config);
  config.cuda_graph = true;
  Trainer trainer(config);
  IterationRecorder recorder;
  trainer.add_observer(&recorder);
  trainer.run();
  cuda_emulator::set_cublaslt_algorithms({});
  expect_resumed_bit_for_bit(recorder.iterations, direct, 0);
  const std::string notes = trainer.backend().run_notes();
  EXPECT_NE(notes.find("algorithms timed for"), std::string::npos) << notes;
  EXPECT_NE(notes.find("CUDA graphs: 2 captured, 6 replays"), std::string::npos) << notes;
  std::smatch calls;
  ASSERT_TRUE(std::regex_search(notes, calls, std::regex("attention forward calls on cuDNN [^:]*: ([0-9]+)"))) << notes;
  EXPECT_GT(std::stoi(calls[1].str()), 0) << notes;
}

}  // namespace
}  // namespace kiln::testing
