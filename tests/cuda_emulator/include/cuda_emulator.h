// A CPU emulator of the part of CUDA that kiln's CUDA back-end uses, so that CI, which has no GPU,
// runs the back-end and every test of it. The .cu files are compiled unchanged by the host
// compiler against this folder's cuda_runtime.h and cub headers, kernels being launched
// through kiln/backend/cuda/launch.cuh (launch() below instead of <<<...>>>); the back-end's .cpp
// files link against cuda_runtime_stand_in.cpp and cublaslt_stand_in.cpp instead of libcudart and
// libcublasLt (CMakeLists.txt: kiln_emulated_cuda, kiln_tests_on_emulator).
//
// Model: the blocks of a grid run one after another; the threads of a block run as fibers on the
// calling OS thread, each until it must wait at a barrier (__syncthreads, __syncwarp, a shuffle, a
// warp-wide matrix instruction), and the next to run is always the first runnable thread in
// schedule order (lowest index first, or highest: set_schedule). So one warp runs as far as it can
// before the next starts, and a missing __syncthreads shows as reads of what other warps have not
// written yet (NaN in fresh shared memory) rather than as a rare race. What the hardware would not
// forgive ends the launch with a failure that says which thread did what (failure()): a barrier
// that some thread never reaches (CUDA asks every thread of the block to reach each __syncthreads,
// so one that has exited counts), a warp collective whose mask names an exited or absent lane,
// dynamic shared memory over the kernel's allowance or written past its end, an ldmatrix or
// cp.async outside it or misaligned. Dynamic shared memory starts as NaN bytes, as on a GPU it
// starts as leftovers.
//
// Asynchronous copies into shared memory land only when the issuing thread waits for them, so a
// missing wait or barrier shows as NaN. The PTX matrix instructions (ldmatrix, mma.sync, wgmma)
// use the documented fragment and shared-memory layouts, which code may rely on; a wgmma runs at
// the wait that covers it, so a missing wait shows as NaN accumulators or as a failure.
//
// Fibers switch in x86-64 assembly (cuda_emulator.cpp): one switch costs nanoseconds, where
// ucontext's swapcontext made a system call, and the kernels switch at every shuffle.
//
// Streams (cuda_runtime_stand_in.cpp): work on a stream of kiln's own (the compute stream every
// kernel and product goes on, the batch stager's copy stream) runs as late as CUDA allows, when
// something waits for it, so a missing event wait or synchronisation shows as stale data.
//
// What it does not model: timing, memory coalescing or bank conflicts, races between blocks
// (they never overlap here), work on the default stream running late (it runs when issued),
// out-of-bounds global accesses (the kernel tests guard their buffers), the memory proxies that
// fence.proxy.async and wgmma.fence order (both are no-ops here), and swizzled wgmma layouts.
#pragma once

#include <driver_types.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cuda_emulator {

// Runs `thread_body` once for every thread of `grid` x `block`. Returns a cudaError_t value: 0, 1
// (invalid value: too much dynamic shared memory for `kernel`), 9 (invalid configuration) or 719
// (launch failure: a misuse inside the kernel, see failure()). The error is also kept for
// get_last_error(), as a real launch's is.
int run(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
        const std::function<void()>& thread_body);

// What CUDA checks when a launch is issued: the block's size, the grid's extents, and the dynamic
// shared memory against the kernel's allowance. Returns 0 or the error, kept as run()'s are.
int check_configuration(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);

// Issues `work` on `stream` (cuda_runtime_stand_in.cpp): on the legacy default stream (null) it
// runs now; on a stream of kiln's own it runs when something waits for that stream's work, or is
// recorded into the stream's graph while the stream is being captured.
void submit(cudaStream_t stream, std::function<void()> work);

// kernel<<<grid, block, shared_bytes, stream>>>(args...): the configuration is checked now, the
// grid runs when `stream` gets to it, with the arguments as they were when issued. A failure inside
// the kernel is kept for get_last_error then, and the stream's synchronisations report it.
template <typename... Params, typename... Args>
void launch_on(cudaStream_t stream, void (*kernel)(Params...), dim3 grid, dim3 block,
               size_t shared_bytes, Args... args) {
  const void* key = reinterpret_cast<const void*>(kernel);
  if (check_configuration(key, grid, block, shared_bytes) != 0) return;
  submit(stream, [=] { run(key, grid, block, shared_bytes, [&] { kernel(args...); }); });
}

// A launch on the legacy default stream: the grid has run when this returns.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
  launch_on(nullptr, kernel, grid, block, shared_bytes, args...);
}

// Which runnable thread of a block runs next: the lowest-numbered (Forward) or the highest
// (Reverse); the two orders give different interleavings to code that lacks a barrier.
enum class Schedule { Forward, Reverse };
void set_schedule(Schedule schedule);

// cudaGetLastError: the first error since the last call, then cleared; peek_last_error leaves it.
int get_last_error();
int peek_last_error();
// Holds (true) or releases a stream: while held, a query of an event on it (cudaEventQuery) answers
// not-ready, as a GPU does while a kernel on the stream spins waiting for a peer (the NCCL
// stand-in's hung collective); waits that block (synchronisations) still run its work, as the
// emulator cannot block. `stream` is a cudaStream_t.
void hold_stream(void* stream, bool held);
// Why the last failed launch failed; empty when none has.
const std::string& failure();
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): launches of
// `kernel` may then use up to `bytes` (at most the device's limit a block) instead of 48 KiB.
int set_max_dynamic_shared_bytes(const void* kernel, int bytes);
// The shared memory the emulated device gives a block (the most a kernel may be allowed) and an SM
// (cudaDevAttrMaxSharedMemoryPerMultiprocessor): an H100's by default; a test sets a smaller GPU's
// to reach the forms kernels take there.
constexpr size_t kH100SharedBytesPerBlock = 227 * 1024, kH100SharedBytesPerSm = 228 * 1024;
void set_shared_memory_limits(size_t per_block, size_t per_sm);
size_t shared_bytes_per_sm();

// Which products with an epilogue the cuBLASLt stand-in accepts: all (the default), none from
// its heuristic (no algorithm found), or none when run (an algorithm offered, then
// CUBLAS_STATUS_NOT_SUPPORTED). Real cuBLASLt may do either for some shapes; kiln must then do the
// epilogue's work in its own kernels.
enum class Epilogues { Offered, NoAlgorithm, RefusedWhenRun };
void set_cublaslt_epilogues(Epilogues epilogues);

// The algorithms the cuBLASLt stand-in's heuristic offers for every product, best first: all compute
// the same result, and algorithm i takes `milliseconds[i]` of wall time more when its stream runs
// it (a negative value: refused when run, CUBLAS_STATUS_NOT_SUPPORTED), so that a choice by timing
// can be seen. The default, and what an empty list restores: one algorithm, costing nothing extra.
void set_cublaslt_algorithms(std::vector<double> milliseconds);
// How many products each algorithm has been issued for since the last set_cublaslt_algorithms.
std::vector<int64_t> cublaslt_runs_by_algorithm();
// How many products have been issued with fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM) in
// this process. Their results here are those of the others: how much precision a GPU's fast
// accumulation loses is not documented, so it is not modelled.
int64_t cublaslt_fast_accumulation_runs();

// Inside a kernel (the calling fiber's thread).
const uint3& thread_index();
const uint3& block_index();
const dim3& block_dim();
const dim3& grid_dim();
unsigned char* dynamic_shared_memory();
int lane();  // linear thread index % 32
void sync_block();
// Waits until every lane of `mask` (which must include the caller's lane) has arrived.
void sync_warp(unsigned mask);
// Publishes `value` for the warp; once every lane of `mask` has, returns what lane `source`
// published.
uint64_t exchange(unsigned mask, uint64_t value, int source);
// A warp-wide collective of all 32 lanes (the matrix instructions below): each publishes `mine`;
// the last to arrive calls complete(the 32 lanes' pointers, scratch) once for the warp, before any
// lane goes on. scratch is the warp's 256 floats, which each lane can read with warp_scratch()
// until it arrives at the warp's next collective.
void gather(const void* mine, const std::function<void(const void* const*, float*)>& complete);
const float* warp_scratch();
// Asynchronous warp work (wgmma, warp_matrix_stand_in.cpp): queue_warp_work, called inside a
// gather's completion, queues `work` for the calling warp under `key`; warp_work_pending says
// whether work under `key` is queued and not yet run; commit_warp_work (every lane) closes the
// queued work into a group; wait_warp_work (every lane) runs every group but the newest `pending`,
// oldest first. A warp that ends with work queued or uncommitted fails the launch.
void queue_warp_work(const void* key, std::function<void()> work);
bool warp_work_pending(const void* key);
void commit_warp_work();
void wait_warp_work(int pending);
// `pointer`'s offset in the block's dynamic shared memory (16-byte aligned), as a shared-memory
// matrix descriptor holds an address; descriptors decode against dynamic_shared_memory().
uint32_t shared_offset(const void* pointer);

// PTX's warp-level matrix instructions and asynchronous copies, with the fragment layouts the PTX
// ISA documents (kiln/backend/cuda/warp_matrix.cuh states them; warp_matrix_stand_in.cpp).
// ldmatrix.m8n8.x4.b16 (.trans when `transposed`): each lane's `row` is 16 bytes of the block's
// dynamic shared memory, 16-byte aligned.
void load_matrices(uint32_t (&r)[4], const void* row, bool transposed);
// mma.sync.m16n8k16.row.col with fp32 accumulation, d += a b; inputs bf16, or fp16 when !bf16.
void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16);
// wgmma.mma_async.m64nNk16 with fp32 accumulators, A (bf16, or fp16 when !bf16) from registers
// and B [16 x n] from shared memory by a matrix descriptor without swizzle (K-major, or MN-major
// when transpose_b). Each warp computes its own 16 rows of D, so the instruction is emulated warp
// by warp: the product runs when wait_warp_work covers it, reading shared memory then, and the
// accumulators (n / 2 floats per lane at d) read as NaN from the issue until then. A's registers
// are read at the issue, and the launch fails if any lane's (at `a`, which must stay in scope until
// then) hold other values at the wait: the tensor cores read them until the wait. Products
// issued on accumulators that an earlier product still has pending accumulate onto its result, as
// the tensor cores chain them.
void warpgroup_multiply(float* d, int n, const uint32_t (&a)[4], uint64_t b_descriptor,
                        bool transpose_b, bool bf16, bool accumulate);
// The same with A [64 x 16] from shared memory by a descriptor too, K-major, or M-major when
// transpose_a (B's MN-major layout with m for n): each warp reads rows [16w, 16w + 16) of it, w its
// index in its warpgroup.
void warpgroup_multiply_shared_a(float* d, int n, uint64_t a_descriptor, uint64_t b_descriptor,
                                 bool transpose_a, bool transpose_b, bool bf16, bool accumulate);
// cp.async.cg of 16 bytes into dynamic shared memory: the first source_bytes (0 or 16) from
// `source`, zeros for the rest. The destination reads as NaN bytes until the issuing thread's
// copy_wait covers the copy's group, which is when the copy is made: a read before the wait (or
// by another thread without a __syncthreads after it) sees NaN, as it could see anything on a GPU.
void copy_async(void* shared_destination, const void* source, int source_bytes);
// cp.async.commit_group: the calling thread's copies since its last commit become one group.
void copy_commit();
// cp.async.wait_group: completes the calling thread's committed groups but the newest `pending`.
void copy_wait(int pending);
// Fails unless [pointer, pointer + bytes) lies in the block's dynamic shared memory and pointer is
// `alignment`-byte aligned; `what` names the operation in the failure.
void check_shared(const void* pointer, size_t bytes, size_t alignment, const char* what);
// Ends the launch with this failure, naming the calling thread.
[[noreturn]] void fail(const std::string& why);

}  // namespace cuda_emulator
