#include "kiln/train/preemption.h"

#include <atomic>
#include <csignal>

namespace kiln {
namespace {

std::atomic<bool> received{false};
static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

extern "C" void on_termination(int) { received.store(true, std::memory_order_relaxed); }

}  // namespace

void catch_termination_signal() {
  struct sigaction action {};
  action.sa_handler = on_termination;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and waits in progress go on; the flag is read between iterations
  sigaction(SIGTERM, &action, nullptr);
}

bool termination_signal_received() { return received.load(std::memory_order_relaxed); }

}  // namespace kiln
