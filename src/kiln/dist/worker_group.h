// Local worker processes for a multi-process job, supervised as torchrun supervises them: start N
// copies of one command, each with its own environment; relay their output line by line with a
// "[rank R] " prefix; when one fails, stop the rest (SIGTERM, a grace period, then SIGKILL) and
// report the failing worker's status; optionally start the whole group again (restarts).
//
// Workers stay in the launcher's process group and are started with PR_SET_PDEATHSIG = SIGKILL,
// so they never outlive the launcher, whether it exits, crashes or is killed (by Slurm, a test, a
// terminal's Ctrl-C); processes the workers start themselves are theirs to stop. SIGINT and SIGTERM
// sent to the launcher while a group runs are forwarded to the workers and end the group with
// status 128 + signal.
//
// Not thread-safe: one thread starts, waits for and destroys a group, and that thread must live
// until the group has ended, since PR_SET_PDEATHSIG fires when the forking thread exits. At most
// one group that forwards signals may exist at a time (it owns the process's SIGINT/SIGTERM
// handlers while it lives and restores the previous ones when destroyed).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::dist {

struct WorkerSpec {
  int rank = 0;                          // the global rank: names the worker in output and messages
  std::vector<std::string> environment;  // "NAME=value" entries added to (or replacing in) the
                                         // launcher's environment
};

struct WorkerGroupOptions {
  std::vector<std::string> command;  // argv; command[0] is looked up on PATH as execvp does
  std::vector<WorkerSpec> workers;   // one process each
  std::vector<int> shown_ranks;      // ranks whose output is relayed; empty: all (the rest is read
                                     // and discarded, so no worker ever blocks on a full pipe)
  double grace_seconds = 5.0;        // between SIGTERM and SIGKILL when stopping
  double monitor_interval_seconds = 0.1;  // longest sleep between checks for exited workers
  int stdout_fd = 1;                      // where workers' stdout lines go
  int stderr_fd = 2;  // where workers' stderr lines and the launcher's own messages go
  std::string message_prefix = "kiln launch: ";
  bool forward_signals = true;  // catch SIGINT/SIGTERM while the group lives (see above)
};

struct GroupExit {
  int status = 0;           // 0 when every worker exited 0; else the first failing worker's exit
                            // status, 128 + signal when it was killed, or 128 + the signal that
                            // stopped the launcher
  int failed_rank = -1;     // the first worker that failed; -1 if none did
  int launcher_signal = 0;  // SIGINT or SIGTERM received by the launcher, 0 if none
};

// One start of the workers. Output lines are written whole (one line is never cut by another's),
// each prefixed "[rank R] "; a final line without a newline is completed with one. A line longer
// than 1 MiB is relayed in 1 MiB pieces, each as a line, so a worker cannot make the launcher's
// memory grow without bound.
class WorkerGroup {
 public:
  explicit WorkerGroup(WorkerGroupOptions options);
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  // SIGKILLs and reaps any worker still running (after a throw in start() or wait()).
  ~WorkerGroup();

  // Forks and execs every worker. Throws kiln::Error naming the command when a worker cannot be
  // started (for example: not found on PATH), after killing and reaping those already started.
  void start();

  // Relays output until every worker has exited 0 or the group has failed and been stopped; on
  // return every worker has been reaped. On failure, writes one line naming the worker first
  // ("rank 1 (pid 1234) exited with status 3; stopping the other 3 workers").
  GroupExit wait();

  // The workers' process ids, in the order of options.workers (valid after start()).
  std::vector<pid_t> pids() const;

 private:
  struct Worker;
  struct Stream;
  class SignalCatcher;

  void relay(Stream& stream, bool until_end);
  void flush_partial(Stream& stream);
  void message(const std::string& text);
  void signal_running(int signal);
  int running_count() const;
  bool reap(GroupExit& exit);
  void kill_and_reap_all();

  WorkerGroupOptions options_;
  std::vector<Worker> workers_;
  std::vector<Stream> streams_;             // two per worker: stdout, then stderr
  std::unique_ptr<SignalCatcher> signals_;  // while the group lives, if forward_signals
  std::string line_;                        // scratch for one prefixed line
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound as port 0, read, closed). Another
// process may take it before the workers do; callers pick a fresh one for each start.
int find_free_port();

// Starts the group make_options(restart) returns, with restart = 0, 1, ...: when a start fails
// for a worker's reason (not a signal to the launcher) and fewer than max_restarts restarts were
// made, writes "restarting the workers (restart k of K)" to the group's stderr_fd and starts a
// fresh group. Returns the last group's status (0: success); throws what start() throws.
int run_with_restarts(int max_restarts,
                      const std::function<WorkerGroupOptions(int restart)>& make_options);

}  // namespace kiln::dist
