// How the group is watched: one thread, one poll() over every worker's stdout and stderr pipes and
// a self-pipe that the SIGINT/SIGTERM handler writes the signal number into (the handler does
// nothing else, so nothing unsafe runs in signal context). poll() sleeps at most the monitor
// interval; after each wake-up waitpid(WNOHANG) reaps whoever exited. A worker's pipes are drained
// when it is reaped, so its last lines come out before the launcher's line about its exit.
#include "kiln/dist/worker_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <memory>

#include "kiln/core/error.h"

extern char** environ;

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLine = size_t{1} << 20;
constexpr int kCaughtSignals[] = {SIGINT, SIGTERM};

int signal_write_fd = -1;  // the live SignalCatcher's pipe; read by the handler only

void on_signal(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  if (::write(signal_write_fd, &byte, 1) < 0) {
    // The pipe is full: enough signals are already waiting to be seen.
  }
  errno = saved_errno;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void make_pipe(int fds[2]) {
  KILN_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe: {}", std::strerror(errno));
}

// Writes all of text; when the destination cannot take it (a closed or broken log) the text is
// dropped, since losing log lines is better than stopping a training job over them.
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

std::string workers(int count) {
  return count == 1 ? "1 worker" : fmt::format("{} workers", count);
}

std::string describe_signal(int signal) {
  const char* name = ::strsignal(signal);
  return fmt::format("signal {} ({})", signal, name ? name : "unknown");
}

}  // namespace

// Owns the process's SIGINT/SIGTERM handlers while it lives; the previous ones come back after.
class WorkerGroup::SignalCatcher {
 public:
  SignalCatcher() {
    KILN_CHECK(signal_write_fd < 0, "only one worker group may forward signals at once");
    make_pipe(pipe_);
    for (int fd : pipe_) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    signal_write_fd = pipe_[1];
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kCaughtSignals); ++i)
      ::sigaction(kCaughtSignals[i], &action, &previous_[i]);
  }
  ~SignalCatcher() {
    restore_previous();
    signal_write_fd = -1;
    close_fd(pipe_[0]);
    close_fd(pipe_[1]);
  }
  int read_fd() const { return pipe_[0]; }
  // Also in a forked child before exec: the worker gets the dispositions the launcher was given.
  void restore_previous() const {
    for (size_t i = 0; i < std::size(kCaughtSignals); ++i)
      ::sigaction(kCaughtSignals[i], &previous_[i], nullptr);
  }
  // The signals caught since the last call, oldest first.
  std::vector<int> take() {
    std::vector<int> caught;
    unsigned char bytes[64];
    ssize_t n = 0;
    while ((n = ::read(pipe_[0], bytes, sizeof bytes)) > 0)
      caught.insert(caught.end(), bytes, bytes + n);
    return caught;
  }

 private:
  int pipe_[2] = {-1, -1};
  struct sigaction previous_[std::size(kCaughtSignals)]{};
};

struct WorkerGroup::Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
};

struct WorkerGroup::Stream {
  int fd = -1;     // read end of the worker's pipe; -1 once closed
  int out_fd = 1;  // where its lines go
  int rank = 0;
  bool shown = true;  // false: read and discarded
  std::string partial;
};

WorkerGroup::WorkerGroup(WorkerGroupOptions options) : options_(std::move(options)) {
  KILN_CHECK(!options_.command.empty(), "no command to run");
  KILN_CHECK(!options_.workers.empty(), "no workers to start");
  KILN_CHECK(options_.grace_seconds >= 0, "the grace period must be >= 0 s, got {}",
             options_.grace_seconds);
  KILN_CHECK(options_.monitor_interval_seconds > 0, "the monitor interval must be > 0 s, got {}",
             options_.monitor_interval_seconds);
}

WorkerGroup::~WorkerGroup() { kill_and_reap_all(); }

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> pids;
  for (const Worker& worker : workers_) pids.push_back(worker.pid);
  return pids;
}

void WorkerGroup::start() {
  KILN_CHECK(workers_.empty(), "a worker group starts once");
  if (options_.forward_signals) signals_ = std::make_unique<SignalCatcher>();
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& argument : options_.command) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  for (const WorkerSpec& spec : options_.workers) {
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string_view variable(*entry);
      const std::string_view name = variable.substr(0, variable.find('=') + 1);
      const bool replaced =
          std::any_of(spec.environment.begin(), spec.environment.end(),
                      [&](const std::string& own) { return own.starts_with(name); });
      if (!replaced) environment.emplace_back(variable);
    }
    for (const std::string& own : spec.environment) {
      KILN_CHECK(own.find('=') != std::string::npos && own.front() != '=',
                 "environment entry '{}' is not NAME=value", own);
      environment.push_back(own);
    }
    std::vector<char*> envp;
    for (std::string& variable : environment) envp.push_back(variable.data());
    envp.push_back(nullptr);

    int out[2], err[2], exec_status[2];
    make_pipe(out);
    make_pipe(err);
    make_pipe(exec_status);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (signals_ != nullptr) signals_->restore_previous();
      // The launcher may have died between fork() and prctl(): then nobody would kill us later.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) ::_exit(126);
      if (::dup2(out[1], STDOUT_FILENO) < 0 || ::dup2(err[1], STDERR_FILENO) < 0) ::_exit(126);
      ::execvpe(argv[0], argv.data(), envp.data());
      const int error = errno;
      if (::write(exec_status[1], &error, sizeof error) < 0) ::_exit(127);
      ::_exit(127);
    }
    const int fork_error = errno;
    close_fd(out[1]);
    close_fd(err[1]);
    close_fd(exec_status[1]);
    if (pid < 0) {
      close_fd(out[0]);
      close_fd(err[0]);
      close_fd(exec_status[0]);
      kill_and_reap_all();
      fail("cannot start worker {}: fork failed: {}", spec.rank, std::strerror(fork_error));
    }
    workers_.push_back({spec.rank, pid, true});
    const bool shown = options_.shown_ranks.empty() ||
                       std::find(options_.shown_ranks.begin(), options_.shown_ranks.end(),
                                 spec.rank) != options_.shown_ranks.end();
    for (int* pipe_end : {&out[0], &err[0]}) {
      ::fcntl(*pipe_end, F_SETFL, ::fcntl(*pipe_end, F_GETFL) | O_NONBLOCK);
      const int destination = pipe_end == &out[0] ? options_.stdout_fd : options_.stderr_fd;
      streams_.push_back({*pipe_end, destination, spec.rank, shown, {}});
    }
    // The status pipe closes on a successful exec (O_CLOEXEC) and carries errno on a failed one.
    int exec_error = 0;
    ssize_t got = 0;
    while ((got = ::read(exec_status[0], &exec_error, sizeof exec_error)) < 0 && errno == EINTR) {
    }
    close_fd(exec_status[0]);
    if (got > 0) {
      kill_and_reap_all();
      fail("cannot run '{}': {}", options_.command[0], std::strerror(exec_error));
    }
  }
}

void WorkerGroup::message(const std::string& text) {
  write_all(options_.stderr_fd, options_.message_prefix + text + "\n");
}

void WorkerGroup::flush_partial(Stream& stream) {
  if (!stream.partial.empty() && stream.shown) {
    line_ = fmt::format("[rank {}] {}\n", stream.rank, stream.partial);
    write_all(stream.out_fd, line_);
  }
  stream.partial.clear();
}

// Reads what the pipe holds now; until_end also closes it (the worker is gone or the group ends).
void WorkerGroup::relay(Stream& stream, bool until_end) {
  char buffer[65536];
  while (stream.fd >= 0) {
    const ssize_t n = ::read(stream.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {  // end of file or a dead pipe
        flush_partial(stream);
        close_fd(stream.fd);
      }
      break;
    }
    if (!stream.shown) continue;
    // All whole lines of one read leave in one write. Lines of different workers never mix
    // because this thread is the only writer and always writes whole lines.
    stream.partial.append(buffer, static_cast<size_t>(n));
    const std::string prefix = fmt::format("[rank {}] ", stream.rank);
    line_.clear();
    size_t begin = 0;
    auto emit = [&](size_t size) {
      line_.append(prefix).append(stream.partial, begin, size).push_back('\n');
    };
    for (size_t end; (end = stream.partial.find('\n', begin)) != std::string::npos; begin = end + 1)
      emit(end - begin);
    for (; stream.partial.size() - begin >= kMaxLine; begin += kMaxLine) emit(kMaxLine);
    stream.partial.erase(0, begin);
    write_all(stream.out_fd, line_);
  }
  if (until_end) {
    flush_partial(stream);
    close_fd(stream.fd);
  }
}

int WorkerGroup::running_count() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                        [](const Worker& worker) { return worker.running; }));
}

void WorkerGroup::signal_running(int signal) {
  for (const Worker& worker : workers_)
    if (worker.running) ::kill(worker.pid, signal);  // unreaped, so the pid is still ours
}

// Reaps the workers that exited; returns true when one of them is the group's first failure.
bool WorkerGroup::reap(GroupExit& exit) {
  bool first_failure = false;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = workers_[i];
    if (!worker.running) continue;
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(worker.pid, &status, WNOHANG)) < 0 && errno == EINTR) {
    }
    KILN_CHECK(done >= 0, "waitpid for rank {} (pid {}) failed: {}", worker.rank, worker.pid,
               std::strerror(errno));
    if (done == 0) continue;
    worker.running = false;
    relay(streams_[2 * i], false);
    relay(streams_[2 * i + 1], false);
    const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (code == 0 || exit.failed_rank >= 0 || exit.launcher_signal != 0) continue;
    exit.status = code;
    exit.failed_rank = worker.rank;
    first_failure = true;
    const std::string how = WIFSIGNALED(status)
                                ? "was killed by " + describe_signal(WTERMSIG(status))
                                : fmt::format("exited with status {}", code);
    const int others = running_count();
    std::string stopping;
    if (others == 1) stopping = "; stopping the other worker";
    if (others > 1) stopping = fmt::format("; stopping the other {} workers", others);
    message(fmt::format("rank {} (pid {}) {}{}", worker.rank, worker.pid, how, stopping));
  }
  return first_failure;
}

GroupExit WorkerGroup::wait() {
  KILN_CHECK(!workers_.empty(), "wait() before start()");
  GroupExit exit;
  const auto interval = std::chrono::duration<double>(options_.monitor_interval_seconds);
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.grace_seconds));
  bool stopping = false, killed = false;
  Clock::time_point deadline;
  auto begin_stop = [&](int signal) {
    stopping = true;
    deadline = Clock::now() + grace;
    signal_running(signal);
  };
  std::vector<pollfd> polled;
  std::vector<Stream*> polled_streams;
  while (running_count() > 0) {
    polled.clear();
    polled_streams.clear();
    for (Stream& stream : streams_) {
      if (stream.fd < 0) continue;
      polled.push_back({stream.fd, POLLIN, 0});
      polled_streams.push_back(&stream);
    }
    if (signals_ != nullptr) polled.push_back({signals_->read_fd(), POLLIN, 0});
    auto sleep = std::chrono::duration_cast<Clock::duration>(interval);
    if (stopping && !killed)
      sleep = std::clamp(deadline - Clock::now(), Clock::duration::zero(), sleep);
    const int timeout_ms =
        static_cast<int>(std::ceil(std::chrono::duration<double, std::milli>(sleep).count()));
    const int ready = ::poll(polled.data(), polled.size(), timeout_ms);
    KILN_CHECK(ready >= 0 || errno == EINTR, "poll failed: {}", std::strerror(errno));
    for (size_t i = 0; ready > 0 && i < polled_streams.size(); ++i)
      if (polled[i].revents != 0) relay(*polled_streams[i], false);
    if (signals_ != nullptr && ready > 0 && polled.back().revents != 0) {
      for (int signal : signals_->take()) {
        if (!stopping) {
          exit.launcher_signal = signal;
          exit.status = 128 + signal;
          const int running = running_count();
          message(fmt::format("received {}; stopping the {}", describe_signal(signal),
                              running == 1 ? "worker" : workers(running)));
          begin_stop(signal);
        } else if (!killed) {
          message(fmt::format("received {} while stopping; killing the workers",
                              describe_signal(signal)));
          signal_running(SIGKILL);
          killed = true;
        }
      }
    }
    if (reap(exit) && !stopping) begin_stop(SIGTERM);
    if (stopping && !killed && Clock::now() >= deadline && running_count() > 0) {
      message(fmt::format("{} still running {} s after SIGTERM; sending SIGKILL",
                          workers(running_count()), options_.grace_seconds));
      signal_running(SIGKILL);
      killed = true;
    }
  }
  for (Stream& stream : streams_) relay(stream, true);
  return exit;
}

void WorkerGroup::kill_and_reap_all() {
  signal_running(SIGKILL);
  for (Worker& worker : workers_) {
    if (!worker.running) continue;
    while (::waitpid(worker.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    worker.running = false;
  }
  for (Stream& stream : streams_) close_fd(stream.fd);
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  KILN_CHECK(fd >= 0, "cannot create a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  const bool found = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  ::close(fd);
  KILN_CHECK(found, "cannot find a free port on 127.0.0.1: {}", std::strerror(error));
  return ntohs(address.sin_port);
}

int run_with_restarts(int max_restarts,
                      const std::function<WorkerGroupOptions(int restart)>& make_options) {
  for (int restart = 0;; ++restart) {
    WorkerGroupOptions options = make_options(restart);
    const int stderr_fd = options.stderr_fd;
    const std::string prefix = options.message_prefix;
    GroupExit exit;
    {
      WorkerGroup group(std::move(options));
      group.start();
      exit = group.wait();
    }
    if (exit.status == 0 || exit.launcher_signal != 0 || restart >= max_restarts) {
      if (exit.status != 0 && exit.launcher_signal == 0 && max_restarts > 0) {
        write_all(stderr_fd, fmt::format("{}giving up after {} restart{}\n", prefix, max_restarts,
                                         max_restarts == 1 ? "" : "s"));
      }
      return exit.status;
    }
    write_all(stderr_fd, fmt::format("{}restarting the workers (restart {} of {})\n", prefix,
                                     restart + 1, max_restarts));
  }
}

}  // namespace kiln::dist
