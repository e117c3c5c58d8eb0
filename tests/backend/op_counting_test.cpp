// The op counter runs nothing, checks each op's arguments as a back-end does, and counts the same
// work the per-op timer measures against.
#include "kiln/backend/op_counting.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "kiln/backend/op_timing.h"
#include "kiln/backend/registry.h"
#include "support/device_tensors.h"
#include "support/error_of.h"

namespace kiln::testing {
namespace {

// A product with bias and GELU, its backward, and a fill, on `backend`.
void some_ops(Backend& backend) {
  DeviceTensors t(backend);
  Rng rng(7);
  const Tensor in = t.floats(random_floats(4 * 3, rng), {4, 3}),
               weight = t.floats(random_floats(3 * 6, rng), {3, 6});
  const Tensor bias = t.floats(random_floats(6, rng), {6});
  const Tensor out = t.poisoned({4, 6}), activated = t.poisoned({4, 6});
  backend.matmul_forward({out, in, weight, bias, WeightLayout::InOut, activated});
  const Tensor dweight = t.floats(std::vector<float>(18, 0.0f), {3, 6}),
               dbias = t.floats(std::vector<float>(6, 0.0f), {6});
  backend.matmul_backward({t.poisoned({4, 3}), dweight, dbias,
                           t.floats(random_floats(24, rng), {4, 6}), in, weight,
                           WeightLayout::InOut});
  backend.fill({t.poisoned({8}), 1.0f});
}

TEST(OpCounting, CountsTheWorkTheTimerMeasures) {
  OpCountingBackend counter;
  OpTimingBackend timing(make_backend("cpu"));
  some_ops(counter);
  some_ops(counter);
  some_ops(timing);
  some_ops(timing);
  std::vector<OpTotals> timed;
  for (const OpTotals& op : timing.times())
    if (!op.host_copy) timed.push_back(op);
  const std::vector<OpTotals> counted = counter.totals();  // copies are not counted
  ASSERT_EQ(counted.size(), 3u);
  ASSERT_EQ(timed.size(), 3u);
  for (const OpTotals& op : counted) {
    const auto match =
        std::find_if(timed.begin(), timed.end(), [&](const OpTotals& t) { return t.op == op.op; });
    ASSERT_NE(match, timed.end()) << op.op;
    EXPECT_EQ(op.calls, 2) << op.op;
    EXPECT_EQ(op.flops, match->flops) << op.op;
    EXPECT_EQ(op.bytes, match->bytes) << op.op;
    EXPECT_EQ(op.total_ms, 0.0) << op.op;
  }
  counter.clear();
  EXPECT_TRUE(counter.totals().empty());
}

TEST(OpCounting, AddressesAreDistinctAlignedAndOwnNoMemory) {
  OpCountingBackend counter;
  {
    const auto a = counter.allocate(100),
               b = counter.allocate(size_t{1} << 40);  // a terabyte: nothing is held
    const auto c = counter.allocate(1);
    for (const auto* buffer : {&a, &b, &c}) {
      EXPECT_NE((*buffer)->data(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 256, 0u);
    }
    EXPECT_GE(static_cast<char*>(b->data()) - static_cast<char*>(a->data()), 100);
    EXPECT_GE(static_cast<char*>(c->data()) - static_cast<char*>(b->data()), int64_t{1} << 40);
    EXPECT_EQ(counter.peak_allocated_bytes(), 101 + (size_t{1} << 40));
  }
  const auto again = counter.allocate(8);
  EXPECT_EQ(counter.peak_allocated_bytes(), 101 + (size_t{1} << 40));
}

TEST(OpCounting, ChecksArgumentsAndRefusesToRun) {
  OpCountingBackend counter;
  DeviceTensors t(counter);
  const Tensor in = t.floats(std::vector<float>(4 * 3), {4, 3}),
               weight = t.floats(std::vector<float>(5 * 6), {5, 6});
  EXPECT_NE(error_of([&] {
              counter.matmul_forward({t.poisoned({4, 6}), in, weight, Tensor{}});
            }).find("matmul_forward"),
            std::string::npos);
  EXPECT_TRUE(counter.totals().empty());
  EXPECT_NE(
      error_of([&] { counter.time_gemm_ms(DType::BF16, false, 8, 8, 8, 1); }).find("times nothing"),
      std::string::npos);
  EXPECT_NE(error_of([&] { counter.make_batch_stager({}); }).find("stages no batches"),
            std::string::npos);
}

// A pooler's ops: the gather reads only the rows it copies; its backward writes all of din to
// write (the other rows zeroed) and reads and writes only the position's rows to add; tanh is
// elementwise.
TEST(OpCounting, GatherRowsMovesItsRowsAndWritesAllOfDin) {
  OpCountingBackend counter;
  DeviceTensors t(counter);
  const Tensor sequences = t.poisoned({2, 5, 8}), rows = t.poisoned({2, 8});  // 320 and 64 bytes
  counter.gather_rows({rows, sequences, 4});
  counter.gather_rows_backward({sequences, rows, 4, GradStore::Write});
  counter.gather_rows_backward({sequences, rows, 4, GradStore::Add});
  counter.tanh_forward({rows, rows});
  counter.tanh_backward({rows, rows, rows});
  std::map<std::string, std::pair<int64_t, double>> calls_and_bytes;
  for (const OpTotals& op : counter.totals()) calls_and_bytes[op.op] = {op.calls, op.bytes};
  using Row = std::pair<int64_t, double>;
  EXPECT_EQ(calls_and_bytes["gather_rows"], (Row{1, 2 * 64.0}));
  EXPECT_EQ(calls_and_bytes["gather_rows_backward"], (Row{2, (64.0 + 320.0) + (64.0 + 2 * 64.0)}));
  EXPECT_EQ(calls_and_bytes["tanh_forward"], (Row{1, 2 * 64.0}));
  EXPECT_EQ(calls_and_bytes["tanh_backward"], (Row{1, 3 * 64.0}));
  EXPECT_NE(error_of([&] { counter.gather_rows({rows, sequences, 5}); }).find("position 5"), std::string::npos);
}

// The encoder's masking of its final hidden states reads all of them and the mask and writes all of
// them (the dropped rows as zeros), checked as a back-end checks it.
TEST(OpCounting, MaskRowsMovesEveryRowAndTheMask) {
  OpCountingBackend counter;
  DeviceTensors t(counter);
  const Tensor rows = t.poisoned({2, 5, 8}), keep = t.ints(std::vector<int32_t>(10, 1), {2, 5});  // 320 and 40 bytes
  counter.mask_rows({rows, rows, keep});
  ASSERT_EQ(counter.totals().size(), 1u);
  EXPECT_EQ(counter.totals()[0].op, "mask_rows");
  EXPECT_EQ(counter.totals()[0].bytes, 2 * 320.0 + 40.0);
  EXPECT_NE(error_of([&] { counter.mask_rows({rows, rows, t.ints(std::vector<int32_t>(3, 1), {3})}); })
                .find("does not split into the 3 rows"),
            std::string::npos);
}

// An fp8 product also writes and reads back each operand's fp8 copy, one byte an element.
TEST(OpCounting, Fp8ProductsMoveTheirCastCopies) {
  OpCountingBackend counter;
  DeviceTensors t(counter, DType::BF16);
  constexpr int64_t M = 32, K = 16, N = 48;
  const Tensor in = t.acts(std::vector<float>(M * K), {M, K}),
               weight = t.acts(std::vector<float>(N * K), {N, K});
  const Tensor out = t.acts(std::vector<float>(M * N), {M, N}),
               dout = t.acts(std::vector<float>(M * N), {M, N});
  const Tensor din = t.acts(std::vector<float>(M * K), {M, K}),
               dweight = t.floats(std::vector<float>(N * K), {N, K});
  const Tensor scalar = t.floats({1.0f}, {1});
  const Fp8Matmul fp8{{scalar, scalar, scalar}, {scalar, scalar, scalar}, {scalar, scalar, scalar}};
  const MatmulForward forward{out, in, weight, Tensor{}, WeightLayout::OutIn};
  MatmulForward forward8 = forward;
  forward8.fp8 = &fp8;
  EXPECT_EQ(work_of(forward8).bytes - work_of(forward).bytes, 2.0 * (M * K + N * K));
  EXPECT_TRUE(work_of(forward8).fp8);
  const MatmulBackward both{din, dweight, Tensor{}, dout, in, weight, WeightLayout::OutIn};
  MatmulBackward both8 = both, weight_only8 = both, weight_only = both;
  both8.fp8 = weight_only8.fp8 = &fp8;
  weight_only.din = weight_only8.din = Tensor{};
  EXPECT_EQ(work_of(both8).bytes - work_of(both).bytes, 2.0 * (2 * M * N + K * M + K * N));
  EXPECT_EQ(work_of(weight_only8).bytes - work_of(weight_only).bytes, 2.0 * (M * N + K * M));
  // `in`'s codes kept (ops.h, in_fp8_t): the forward writes them once more; the backward reads them
  // (K M bytes) instead of reading `in` (2 M K) and writing and reading its own copy (2 K M).
  const Tensor codes = t.upload(std::vector<uint8_t>(K * M), {K, M}, DType::F8E4M3);
  MatmulForward keeping = forward8;
  keeping.in_fp8_t = codes;
  EXPECT_EQ(work_of(keeping).bytes - work_of(forward8).bytes, 1.0 * M * K);
  MatmulBackward from_codes = both8;
  from_codes.in = Tensor{};
  from_codes.in_fp8_t = codes;
  EXPECT_EQ(work_of(both8).bytes - work_of(from_codes).bytes, 2.0 * M * K + 2.0 * K * M - K * M);
  EXPECT_EQ(work_of(from_codes).op, work_of(both8).op);  // "matmul_backward 32x16x48 fp8", from the codes' shape
  EXPECT_EQ(work_of(from_codes).flops, work_of(both8).flops);
  // Of those bytes, the casts' passes (op_work.h) read each 16-bit operand (2 bytes an element) and
  // write its codes (1 byte, twice for two layouts); the products' reads of the codes are not theirs.
  EXPECT_EQ(work_of(forward).pass_bytes, 0.0);
  EXPECT_EQ(work_of(both).pass_bytes, 0.0);
  EXPECT_EQ(work_of(forward8).pass_bytes, 3.0 * (M * K + N * K));
  EXPECT_EQ(work_of(keeping).pass_bytes, 4.0 * M * K + 3.0 * N * K);
  EXPECT_EQ(work_of(both8).pass_bytes, 4.0 * M * N + 3.0 * K * N + 3.0 * M * K);
  EXPECT_EQ(work_of(weight_only8).pass_bytes, 3.0 * M * N + 3.0 * M * K);
  EXPECT_EQ(work_of(from_codes).pass_bytes, 4.0 * M * N + 3.0 * K * N);
  counter.matmul_forward(forward8);
  counter.matmul_backward(both8);
  counter.matmul_forward(keeping);
  counter.matmul_backward(from_codes);
  EXPECT_EQ(counter.totals().size(), 2u);  // the same two labels
}

// A product that casts its GELU output for the next fp8 product (ops.h, gelu_fp8) writes the codes
// in place of the 16-bit GELU output, in a pass that reads its output again.
TEST(OpCounting, AGeluCastMovesItsPass) {
  OpCountingBackend counter;
  DeviceTensors t(counter, DType::BF16);
  constexpr int64_t M = 32, K = 16, N = 48;
  const Tensor in = t.acts(std::vector<float>(M * K), {M, K}), weight = t.acts(std::vector<float>(K * N), {K, N});
  const Tensor out = t.acts(std::vector<float>(M * N), {M, N}), gelu = t.acts(std::vector<float>(M * N), {M, N});
  const Tensor codes = t.upload(std::vector<uint8_t>(M * N), {M, N}, DType::F8E4M3),
               codes_t = t.upload(std::vector<uint8_t>(N * M), {N, M}, DType::F8E4M3);
  const Tensor scalar = t.floats({1.0f}, {1});
  const Fp8Operand next{scalar, scalar, scalar};
  const MatmulForward plain{out, in, weight, Tensor{}, WeightLayout::InOut, gelu};
  MatmulForward cast{out, in, weight, Tensor{}, WeightLayout::InOut, codes};
  cast.gelu_fp8 = &next;
  cast.gelu_out_t = codes_t;
  EXPECT_EQ(work_of(plain).op, "matmul_forward 32x16x48 +gelu");
  EXPECT_EQ(work_of(cast).op, "matmul_forward 32x16x48 +gelu codes");
  // 2 bytes of GELU output an element become 2 of codes, and the pass reads the output (2 bytes).
  EXPECT_EQ(work_of(cast).bytes - work_of(plain).bytes, 2.0 * M * N);
  EXPECT_EQ(work_of(cast).pass_bytes, 4.0 * M * N);
  EXPECT_EQ(work_of(cast).flops, work_of(plain).flops);
}

}  // namespace
}  // namespace kiln::testing
