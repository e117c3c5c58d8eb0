// The CPU emulator of CUDA's execution model (cuda_emulator.h): blocks in turn, a block's threads
// as fibers resumed round-robin by a scheduler until each reaches a barrier.
#include "cuda_emulator.h"

#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

// switch_stacks(save, load): saves the callee-saved registers and the floating-point control words
// on the current stack, stores its pointer in *save, and resumes the stack `load` (left by an
// earlier switch_stacks, or prepared by start_stack). The System V x86-64 ABI's callee-saved set;
// ucontext's swapcontext also saves the signal mask with a system call per switch, which made the
// emulator a hundred times slower (the kernels switch at every shuffle).
extern "C" void cuda_emulator_switch_stacks(void** save, void* load);
asm(R"(
  .text
  .globl cuda_emulator_switch_stacks
  .type cuda_emulator_switch_stacks, @function
cuda_emulator_switch_stacks:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emulator_switch_stacks, .-cuda_emulator_switch_stacks
  .section .note.GNU-stack, "", @progbits
  .text
)");

namespace cuda_emulator {
namespace {

// A stack that the first switch_stacks to it starts in entry(), which must never return: the
// frame switch_stacks pops (control words, six registers, the return address) on top of a 16-byte
// aligned end, with a null return address above for entry's own frame.
void* start_stack(char* stack, size_t bytes, void (*entry)()) {
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer: the frames of the stack's last fiber, which never return, leave their
  // redzones poisoned.
  __asan_unpoison_memory_region(stack, bytes);
#endif
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slots = reinterpret_cast<uint64_t*>(top - 16);
  slots[0] = reinterpret_cast<uint64_t>(entry);
  slots[1] = 0;
  uint64_t* frame = slots - 7;
  for (int i = 1; i < 7; ++i) frame[i] = 0;  // r15 .. rbp
  uint32_t control_words[2];
  asm volatile("stmxcsr %0" : "=m"(control_words[0]));
  asm volatile("fnstcw %0" : "=m"(control_words[1]));
  std::memcpy(&frame[0], control_words, sizeof(control_words));
  return frame;
}

constexpr int kLaunchFailure = 719, kInvalidValue = 1, kInvalidConfiguration = 9;
constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 256;
constexpr size_t kSharedAlignment = 128;  // as launch.cuh's KILN_DYNAMIC_SHARED_MEMORY promises
constexpr unsigned char kGuardByte = 0xA5;

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Done };

// A cp.async copy not made yet (copy_async).
struct AsyncCopy {
  void* destination;
  const void* source;
  int source_bytes;
};

struct Thread {
  void* stack_pointer = nullptr;  // where it was switched away from, or start_stack's
  uint3 index;
  int linear = 0;
  State state = State::Runnable;
  std::vector<AsyncCopy> open_copies;                    // issued since the last commit
  std::vector<std::vector<AsyncCopy>> committed_copies;  // groups, oldest first
};

struct Warp {
  unsigned lanes = 0;         // the lanes that exist (the last warp of a block may be partial)
  unsigned barrier_mask = 0;  // the mask of the barrier under way, 0 when none
  unsigned arrived = 0;
  unsigned exited = 0;  // lanes whose thread has returned
  // A shuffle: the values published, the lane each lane reads, what each lane gets.
  uint64_t slots[32] = {};
  int sources[32] = {};
  uint64_t results[32] = {};
  // A matrix instruction (gather): each lane's operands, and what the completion leaves for the
  // lanes.
  const void* pointers[32] = {};
  float scratch[256] = {};
  // Asynchronous matrix work (wgmma) queued by the warp, then closed into groups, oldest first;
  // each item with the key it was queued under.
  std::vector<std::pair<const void*, std::function<void()>>> open_work;
  std::deque<std::vector<std::pair<const void*, std::function<void()>>>> committed_work;
};

struct Block {
  dim3 grid, block;
  uint3 index;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  // Dynamic shared memory: kSharedAlignment-aligned in shared_storage, the kernel's bytes, then a
  // guard.
  std::vector<unsigned char> shared_storage;
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  int alive = 0, at_block_barrier = 0;
  int first_candidate = 0;  // schedule position below which no thread is runnable
  Thread* current = nullptr;
  const std::function<void()>* body = nullptr;
  void* scheduler = nullptr;  // the scheduler's stack pointer while a thread runs
  std::string failure;
};

Block* running = nullptr;  // the block whose fibers are being run, or null outside a launch
Schedule schedule = Schedule::Forward;
int last_error = 0;
std::string last_failure;
std::map<const void*, size_t> shared_allowance;
size_t max_shared_per_block = kH100SharedBytesPerBlock, shared_per_sm = kH100SharedBytesPerSm;

// A fiber's stack, with an inaccessible page below it so that an overflow faults instead of
// silently overwriting the next stack.
class Stack {
 public:
  Stack() {
    void* memory = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::runtime_error("cuda_emulator: cannot map a fiber stack");
    mprotect(memory, page(), PROT_NONE);
    base_ = static_cast<char*>(memory);
  }
  ~Stack() { munmap(base_, kStackBytes + page()); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return base_ + page(); }

 private:
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  char* base_ = nullptr;
};
std::vector<std::unique_ptr<Stack>> stacks;

std::string describe(const uint3& v) {
  std::string text =
      "(";  // appended, not "(" + ...: GCC 12 warns falsely of overlapping copies there
  text += std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
  return text;
}

Block& block() {
  if (!running || !running->current) {
    last_failure = "a device function was called outside a kernel";
    throw std::logic_error(last_failure);
  }
  return *running;
}

Thread& self() { return *block().current; }

// Where thread `index` comes in the schedule's order (and the thread at a position: its own
// inverse).
int position(const Block& b, int index) {
  return schedule == Schedule::Forward ? index : static_cast<int>(b.threads.size()) - 1 - index;
}

void make_runnable(Block& b, Thread& t) {
  t.state = State::Runnable;
  b.first_candidate = std::min(b.first_candidate, position(b, t.linear));
}

// The first runnable thread in schedule order, or null.
Thread* next_runnable(Block& b) {
  const int count = static_cast<int>(b.threads.size());
  for (; b.first_candidate < count; ++b.first_candidate) {
    Thread& t = b.threads[static_cast<size_t>(position(b, b.first_candidate))];
    if (t.state == State::Runnable) return &t;
  }
  return nullptr;
}

// Leaves thread `from` (waiting, done, or runnable but no longer first) for the next runnable
// thread, directly, or for the scheduler when there is none; returns when `from` is resumed.
void switch_onward(Block& b, Thread& from) {
  Thread* next = next_runnable(b);
  if (next == &from) return;
  b.current = next;
  cuda_emulator_switch_stacks(&from.stack_pointer, next ? next->stack_pointer : b.scheduler);
}

// Lets the schedule pick who runs next (maybe the caller); returns when the caller runs again.
void yield() {
  Block& b = block();
  switch_onward(b, *b.current);
}

void release_block_barrier(Block& b) {
  for (Thread& t : b.threads)
    if (t.state == State::AtBlockBarrier) make_runnable(b, t);
  b.at_block_barrier = 0;
}

void release_warp_barrier(Block& b, int warp) {
  Warp& w = b.warps[warp];
  for (int lane = 0; lane < 32; ++lane)
    if (w.barrier_mask >> lane & 1u) make_runnable(b, b.threads[warp * 32 + lane]);
  w.barrier_mask = 0;
  w.arrived = 0;
}

void fiber_entry() {
  Block& b = *running;
  (*b.body)();
  Thread& t = *b.current;
  t.state = State::Done;
  --b.alive;
  Warp& w = b.warps[t.linear / 32];
  w.exited |= 1u << (t.linear % 32);
  if (w.barrier_mask >> (t.linear % 32) & 1u)
    b.failure =
        "thread " + describe(t.index) + " exited while its warp waits for it at a warp barrier";
  if (b.at_block_barrier > 0)
    b.failure = "thread " + describe(t.index) + " exited while other threads wait at __syncthreads";
  if (!b.failure.empty()) {
    b.current = nullptr;
    cuda_emulator_switch_stacks(&t.stack_pointer, b.scheduler);  // never resumed
  }
  switch_onward(b, t);  // never resumed
  std::abort();
}

std::string waiting_threads(const Block& b) {
  std::string text;
  int shown = 0;
  for (const Thread& t : b.threads) {
    if (t.state == State::Done || shown == 4) continue;
    text += (shown++ ? ", " : "") + describe(t.index) +
            (t.state == State::AtBlockBarrier ? " at __syncthreads" : " at a warp barrier");
  }
  return text;
}

// Runs one block's threads to completion; false with b.failure set on a misuse.
bool run_block(Block& b) {
  const int count = static_cast<int>(b.threads.size());
  for (int i = 0; i < count; ++i) {
    b.threads[static_cast<size_t>(i)].stack_pointer =
        start_stack(stacks[static_cast<size_t>(i)]->bottom(), kStackBytes, fiber_entry);
  }
  // Always the first runnable thread in schedule order: one warp runs as far as it can (to a block
  // barrier, or its end) before the next starts, so a missing __syncthreads makes it read what the
  // other warps have not written yet (NaN, in fresh shared memory).
  // Threads hand over to each other (switch_onward) and come back here only when none is runnable:
  // all done, a deadlock, or a failure.
  while (b.alive > 0) {
    Thread* next = next_runnable(b);
    if (!next) {
      b.failure = "deadlock: no thread can go on; waiting: " + waiting_threads(b);
      return false;
    }
    b.current = next;
    cuda_emulator_switch_stacks(&b.scheduler, next->stack_pointer);
    b.current = nullptr;
    if (!b.failure.empty()) return false;
  }
  for (const Warp& w : b.warps)
    if (!w.open_work.empty() || !w.committed_work.empty()) {
      b.failure = "a warp ended with asynchronous matrix work (wgmma) it never waited for";
      return false;
    }
  for (size_t i = b.shared_bytes; i < b.shared_bytes + kGuardBytes; ++i)
    if (b.shared[i] != kGuardByte) {
      b.failure = "a thread wrote past the " + std::to_string(b.shared_bytes) +
                  " bytes of dynamic shared memory";
      return false;
    }
  return true;
}

int finish(int error, const std::string& why) {
  if (error != 0 && last_error == 0) {
    last_error = error;
    last_failure = why;
  }
  return error;
}

}  // namespace

int check_configuration(const void* kernel, dim3 grid, dim3 block_shape, size_t shared_bytes) {
  const uint64_t threads = static_cast<uint64_t>(block_shape.x) * block_shape.y * block_shape.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535)
    return finish(kInvalidConfiguration, "invalid launch configuration: grid " + describe(grid) +
                                             ", block " + describe(block_shape));
  const auto allowance = shared_allowance.find(kernel);
  const size_t allowed = std::min(
      allowance == shared_allowance.end() ? kDefaultSharedBytes : allowance->second, max_shared_per_block);
  if (shared_bytes > allowed)
    return finish(kInvalidValue, std::to_string(shared_bytes) +
                                     " bytes of dynamic shared memory requested, " +
                                     std::to_string(allowed) + " allowed for this kernel");
  return 0;
}

int run(const void* kernel, dim3 grid, dim3 block_shape, size_t shared_bytes,
        const std::function<void()>& thread_body) {
  if (const int error = check_configuration(kernel, grid, block_shape, shared_bytes)) return error;
  const uint64_t threads = static_cast<uint64_t>(block_shape.x) * block_shape.y * block_shape.z;
  while (stacks.size() < threads) stacks.push_back(std::make_unique<Stack>());

  Block b;
  b.grid = grid;
  b.block = block_shape;
  b.body = &thread_body;
  b.shared_bytes = shared_bytes;
  b.threads.resize(threads);
  b.warps.resize((threads + 31) / 32);
  for (uint64_t i = 0; i < threads; ++i) {
    Thread& t = b.threads[i];
    t.linear = static_cast<int>(i);
    t.index = uint3{static_cast<unsigned>(i % block_shape.x),
                    static_cast<unsigned>(i / block_shape.x % block_shape.y),
                    static_cast<unsigned>(i / block_shape.x / block_shape.y)};
    b.warps[i / 32].lanes |= 1u << (i % 32);
  }
  b.shared_storage.resize(shared_bytes + kGuardBytes + kSharedAlignment);
  const auto storage = reinterpret_cast<uintptr_t>(b.shared_storage.data());
  b.shared =
      b.shared_storage.data() + (kSharedAlignment - storage % kSharedAlignment) % kSharedAlignment;
  Block* const outer = running;
  running = &b;
  std::string failure;
  for (unsigned z = 0; z < grid.z && failure.empty(); ++z)
    for (unsigned y = 0; y < grid.y && failure.empty(); ++y)
      for (unsigned x = 0; x < grid.x && failure.empty(); ++x) {
        b.index = uint3{x, y, z};
        std::memset(b.shared, 0xFF, shared_bytes);  // NaN in every float type
        std::memset(b.shared + shared_bytes, kGuardByte, kGuardBytes);
        for (Thread& t : b.threads) {
          t.state = State::Runnable;
          t.open_copies.clear();
          t.committed_copies.clear();
        }
        for (Warp& w : b.warps) w.barrier_mask = w.arrived = w.exited = 0;
        b.alive = static_cast<int>(threads);
        b.at_block_barrier = 0;
        b.first_candidate = 0;
        if (!run_block(b)) failure = "block " + describe(b.index) + ": " + b.failure;
      }
  running = outer;
  return failure.empty() ? 0 : finish(kLaunchFailure, failure);
}

void set_schedule(Schedule order) { schedule = order; }

int get_last_error() {
  const int error = last_error;
  last_error = 0;
  return error;
}

int peek_last_error() { return last_error; }

const std::string& failure() { return last_failure; }

void set_shared_memory_limits(size_t per_block, size_t per_sm) {
  max_shared_per_block = per_block;
  shared_per_sm = per_sm;
}

size_t shared_bytes_per_sm() { return shared_per_sm; }

int set_max_dynamic_shared_bytes(const void* kernel, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > max_shared_per_block) return kInvalidValue;
  shared_allowance[kernel] = static_cast<size_t>(bytes);
  return 0;
}

const uint3& thread_index() { return self().index; }
const uint3& block_index() { return block().index; }
const dim3& block_dim() { return block().block; }
const dim3& grid_dim() { return block().grid; }
unsigned char* dynamic_shared_memory() { return block().shared; }
int lane() { return self().linear % 32; }

void fail(const std::string& why) {
  Block& b = block();
  b.failure = "thread " + describe(b.current->index) + ": " + why;
  b.current->state = State::Done;
  cuda_emulator_switch_stacks(&b.current->stack_pointer, b.scheduler);  // never resumed
  std::abort();
}

void sync_block() {
  Block& b = block();
  if (b.alive < static_cast<int>(b.threads.size()))
    fail("__syncthreads after some threads of the block have exited (a barrier in divergent code)");
  b.current->state = State::AtBlockBarrier;
  if (++b.at_block_barrier == b.alive) release_block_barrier(b);
  yield();  // even when this thread released the others: the schedule picks who goes on first
}

namespace {

// The calling lane arrives at a warp barrier over `mask`; the last lane to arrive calls
// complete(warp) before releasing the others, so a collective needs one barrier, not two.
template <typename Complete>
void arrive(unsigned mask, Complete complete) {
  Block& b = block();
  Thread& t = *b.current;
  const int lane_id = t.linear % 32;
  Warp& w = b.warps[t.linear / 32];
  if (!(mask >> lane_id & 1u)) fail("a warp barrier's mask leaves out the calling lane");
  if (mask & ~w.lanes) fail("a warp barrier's mask names lanes the block does not have");
  if (w.barrier_mask != 0 && w.barrier_mask != mask)
    fail("lanes of one warp wait at barriers with different masks");
  if (const unsigned gone = mask & w.exited)
    fail("a warp barrier's mask names lane " + std::to_string(std::countr_zero(gone)) +
         ", which has exited");
  w.barrier_mask = mask;
  w.arrived |= 1u << lane_id;
  t.state = State::AtWarpBarrier;
  if (w.arrived == mask) {
    complete(w);
    release_warp_barrier(b, t.linear / 32);
  }
  yield();
}

Warp& my_warp() { return block().warps[static_cast<size_t>(self().linear / 32)]; }

}  // namespace

void sync_warp(unsigned mask) {
  arrive(mask, [](Warp&) {});
}

uint64_t exchange(unsigned mask, uint64_t value, int source) {
  if (source < 0 || source > 31 || !(mask >> source & 1u))
    fail("a shuffle reads a lane outside its mask");
  Warp& w = my_warp();
  const int me = lane();
  w.slots[me] = value;
  w.sources[me] = source;
  arrive(mask, [mask](Warp& warp) {
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) warp.results[l] = warp.slots[warp.sources[l]];
  });
  return w.results[me];  // rewritten only when this lane has arrived at the warp's next collective
}

void gather(const void* mine, const std::function<void(const void* const*, float*)>& complete) {
  Warp& w = my_warp();
  if (w.lanes != 0xffffffffu)
    fail("a warp-wide matrix operation in a warp of fewer than 32 threads");
  w.pointers[lane()] = mine;
  arrive(0xffffffffu, [&complete](Warp& warp) { complete(warp.pointers, warp.scratch); });
}

void queue_warp_work(const void* key, std::function<void()> work) {
  my_warp().open_work.emplace_back(key, std::move(work));
}

bool warp_work_pending(const void* key) {
  const Warp& w = my_warp();
  const auto queued = [key](const auto& items) {
    return std::any_of(items.begin(), items.end(), [key](const auto& item) { return item.first == key; });
  };
  return queued(w.open_work) || std::any_of(w.committed_work.begin(), w.committed_work.end(), queued);
}

void commit_warp_work() {
  arrive(0xffffffffu, [](Warp& w) {
    w.committed_work.push_back(std::move(w.open_work));
    w.open_work.clear();
  });
}

void wait_warp_work(int pending) {
  arrive(0xffffffffu, [pending](Warp& w) {
    while (w.committed_work.size() > static_cast<size_t>(pending)) {
      for (const auto& work : w.committed_work.front()) work.second();
      w.committed_work.pop_front();
    }
  });
}

uint32_t shared_offset(const void* pointer) {
  check_shared(pointer, 1, 16, "a shared-memory matrix descriptor");
  return static_cast<uint32_t>(static_cast<const unsigned char*>(pointer) - block().shared);
}

const float* warp_scratch() {
  return block().warps[static_cast<size_t>(self().linear / 32)].scratch;
}

void check_shared(const void* pointer, size_t bytes, size_t alignment, const char* what) {
  const Block& b = block();
  const auto* bytes_at = static_cast<const unsigned char*>(pointer);
  if (bytes_at < b.shared || bytes_at + bytes > b.shared + b.shared_bytes)
    fail(std::string(what) + " addresses memory outside the block's dynamic shared memory");
  if (reinterpret_cast<uintptr_t>(pointer) % alignment != 0)
    fail(std::string(what) + " addresses shared memory not " + std::to_string(alignment) +
         "-byte aligned");
}

void copy_async(void* shared_destination, const void* source, int source_bytes) {
  constexpr size_t kBytes = 16;
  check_shared(shared_destination, kBytes, kBytes, "cp.async");
  if (source_bytes != 0 && source_bytes != static_cast<int>(kBytes))
    fail("cp.async of " + std::to_string(source_bytes) + " source bytes (kiln copies 16 or 0)");
  if (source_bytes != 0 && reinterpret_cast<uintptr_t>(source) % kBytes != 0)
    fail("cp.async reads global memory not 16-byte aligned");
  std::memset(shared_destination, 0xFF, kBytes);  // in flight: undefined until waited for
  self().open_copies.push_back({shared_destination, source, source_bytes});
}

void copy_commit() {
  Thread& t = self();
  t.committed_copies.push_back(std::move(t.open_copies));
  t.open_copies.clear();
}

void copy_wait(int pending) {
  Thread& t = self();
  while (t.committed_copies.size() > static_cast<size_t>(std::max(pending, 0))) {
    for (const AsyncCopy& copy : t.committed_copies.front()) {
      std::memset(copy.destination, 0, 16);
      if (copy.source_bytes > 0)
        std::memcpy(copy.destination, copy.source, static_cast<size_t>(copy.source_bytes));
    }
    t.committed_copies.erase(t.committed_copies.begin());
  }
}

}  // namespace cuda_emulator
