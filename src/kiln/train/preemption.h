// Preemption: Megatron-LM's clean stops (--exit-signal-handler, --exit-duration-in-mins,
// --exit-interval). A scheduler about to take the machine (Slurm's `--signal=TERM@120`, a
// preemptible queue) sends SIGTERM; the run finishes its iteration, saves, and exits 0, and the
// same command with --load resumes it.
//
// TerminationSignal: the process-wide flag a SIGTERM sets once catch_termination_signal() has
// installed the handler (async-signal-safe: it only stores to a lock-free atomic). The Trainer
// reads it between iterations and agrees with the other ranks before stopping (trainer.cpp).
#pragma once

namespace kiln {

// Installs the SIGTERM handler; idempotent. Until then SIGTERM keeps its default (terminate).
void catch_termination_signal();
// Whether a SIGTERM arrived since catch_termination_signal().
bool termination_signal_received();

}  // namespace kiln
