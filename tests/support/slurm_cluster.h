// A real one-node Slurm cluster for tests: munged, slurmctld and slurmd (Debian's slurm-wlm and
// munge, installed by scripts/install-deps.sh), each started in the foreground as a child of the
// test, in its own process group, with everything they write in a throw-away folder:
// - munged with its own key (1024 random bytes, mode 0400, owned by the user running the test),
//   socket, pid, seed and log files, so it needs neither /etc/munge nor /run/munge;
// - a slurm.conf for one node, NodeName=localhost at 127.0.0.1 (so the step's node list resolves
//   everywhere), as many CPUs as this machine has (at least 2), free ports for slurmctld and slurmd,
//   no cgroups (proctrack/linuxproc, task/none: fit for a container), auth/munge through that
//   socket, SlurmUser the user running the test (root in CI), and FirstJobId picked so that the
//   first job's derived MASTER_PORT (15000 + id % 10000, dist/bootstrap.h) is free.
// The constructor waits (up to 30 s) until sinfo shows the node idle. available() is false, with
// reason() naming what failed and the daemons' last log lines, when the programs are missing or the
// daemons cannot start (a kernel or container limit), so a test can GTEST_SKIP() visibly.
// The destructor stops slurmd, slurmctld and munged (SIGTERM to each process group, SIGKILL after
// 5 s), then every process left that carries this cluster's SLURM_CONF in its environment (a job
// step's slurmstepd and tasks, an srun), and removes the folder, also when the test fails.
// If the test process is killed instead: the daemons get SIGKILL from the kernel
// (PR_SET_PDEATHSIG), and a watchdog (a shell started first, in its own process group, waiting for
// the end of a pipe only the test holds) kills whatever else carries this SLURM_CONF and removes
// the folder.
//
// command_prefix() is what to put before a shell command run through the cluster (srun, sbatch): it
// sets SLURM_CONF and removes every inherited SLURM_* variable and torchrun's (a test run inside a
// real Slurm job or under `kiln launch` must not leak its own place into these jobs).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "support/kiln_process.h"
#include "support/loopback.h"
#include "support/temp_dir.h"

extern char** environ;

namespace kiln::testing {

namespace slurm_detail {

// Binds a TCP socket on every interface at `port` (0: one the kernel picks) and returns the port
// bound, or 0 when it is taken.
inline int bind_any(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    socklen_t length = sizeof(address);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    bound = ntohs(address.sin_port);
  }
  ::close(fd);
  return bound;
}

// The program's full path: PATH, then the sbin folders (where Debian puts the daemons, often not on
// a user's PATH); "" when absent.
inline std::string find_program(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/local/sbin:/usr/bin:/bin";
  std::stringstream folders(path);
  for (std::string folder; std::getline(folders, folder, ':');) {
    if (folder.empty()) continue;
    const std::string candidate = folder + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The last `count` lines of a file, each indented; "" when it is missing or empty.
inline std::string last_lines(const std::string& path, size_t count) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; in && std::getline(in, line);) lines.push_back(line);
  std::string text;
  for (size_t i = lines.size() > count ? lines.size() - count : 0; i < lines.size(); ++i) text += "  " + lines[i] + "\n";
  return text;
}

}  // namespace slurm_detail

class SlurmCluster {
 public:
  static constexpr const char* kNode = "localhost";
  static constexpr int kStartSeconds = 30;

  SlurmCluster() {
    for (const char* program : {"munged", "slurmctld", "slurmd", "srun", "sinfo", "sbatch"}) {
      programs_.push_back(slurm_detail::find_program(program));
      if (programs_.back().empty()) {
        reason_ = std::string(program) +
                  " is not installed (scripts/install-deps.sh, run by `make test`, installs Debian's slurm-wlm and munge)";
        return;
      }
    }
    start_watchdog();
    // A port taken between choosing it and slurmctld's bind (another test's) is retried with others.
    for (int attempt = 1; attempt <= 3; ++attempt) {
      reason_.clear();
      if (start()) return;
      const bool port_taken = logs().find("Address already in use") != std::string::npos;
      stop();
      if (!port_taken) break;
    }
  }
  ~SlurmCluster() {
    stop();
    stop_watchdog();
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool available() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }

  const std::string& conf() const { return conf_; }
  std::string srun() const { return programs_[3]; }
  std::string sinfo() const { return programs_[4]; }
  std::string sbatch() const { return programs_[5]; }
  // The id the next job gets, while no job has run yet; its MASTER_PORT was free at start.
  int first_job_id() const { return first_job_id_; }

  std::string command_prefix() const {
    return "for v in $(env | sed -n 's/^\\(SLURM_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done; "
           "unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT; "
           "export SLURM_CONF=" + conf_ + "; ";
  }

  // The last lines of every daemon's log file and of its stdout and stderr, for failure messages.
  std::string logs() const {
    std::string text;
    for (const char* daemon : {"munged", "slurmctld", "slurmd"}) {
      bool any = false;
      for (const char* suffix : {".log", ".out"}) {
        const std::string path = dir_ + "/" + daemon + suffix, lines = slurm_detail::last_lines(path, 12);
        if (!lines.empty()) text += path + ":\n" + lines;
        any = any || !lines.empty();
      }
      if (!any) text += std::string(daemon) + ": nothing written (not started?)\n";
    }
    return text;
  }

 private:
  struct Daemon {
    std::string name;
    pid_t pid = -1;
  };

  bool fail(const std::string& what) {
    reason_ = "the test's Slurm cluster did not start: " + what + "\n" + logs();
    return false;
  }

  // Forks `argv` in its own process group with SLURM_CONF set and the inherited SLURM_* variables
  // removed, stdout and stderr to <name>.out; everything the child needs is built before the fork.
  bool spawn(const std::string& name, const std::vector<std::string>& argv) {
    std::vector<std::string> environment_strings{"SLURM_CONF=" + conf_};
    for (char** variable = environ; *variable != nullptr; ++variable)
      if (std::string_view(*variable).substr(0, 6) != "SLURM_") environment_strings.emplace_back(*variable);
    std::vector<char*> arguments, environment;
    for (const std::string& argument : argv) arguments.push_back(const_cast<char*>(argument.c_str()));
    arguments.push_back(nullptr);
    for (const std::string& variable : environment_strings) environment.push_back(const_cast<char*>(variable.c_str()));
    environment.push_back(nullptr);
    const std::string output = dir_ + "/" + name + ".out";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return fail("fork failed for " + name);
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the test died before prctl
      const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, 0);
      ::execve(arguments[0], arguments.data(), environment.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also from here, so a kill of the group right away finds it
    daemons_.push_back({name, pid});
    return true;
  }

  // The daemon that has exited, if any ("" when all still run).
  std::string exited_daemon() {
    for (Daemon& daemon : daemons_) {
      int status = 0;
      if (daemon.pid > 0 && ::waitpid(daemon.pid, &status, WNOHANG) == daemon.pid) {
        daemon.pid = -1;
        return daemon.name + " exited (" +
               (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                  : "signal " + std::to_string(WTERMSIG(status))) +
               ")";
      }
    }
    return "";
  }

  bool start() {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::seconds(kStartSeconds);
    dir_ = root_ / ("attempt-" + std::to_string(++attempts_));
    const std::string dir = dir_;
    std::filesystem::create_directories(dir);
    // munged checks the folders on the way to its socket and key: searchable by all, writable by
    // the owner alone.
    ::chmod(root_.path().c_str(), 0755);
    ::chmod(dir.c_str(), 0755);
    conf_ = dir + "/slurm.conf";
    const std::string key = dir + "/munge.key", socket = dir + "/munge.socket";
    // Unix socket paths (munged's; slurmd's per job step, spool/localhost_<job>.<step>) hold 107 bytes.
    if (dir.size() > 60) return fail("the temp folder's path is too long for Unix sockets: " + dir + " (set TMPDIR)");
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      random.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      write_file_bytes(key, bytes);
    }
    if (::chmod(key.c_str(), 0400) != 0) return fail("cannot make " + key + " mode 0400");
    for (const char* folder : {"state", "spool"}) std::filesystem::create_directories(dir + "/" + folder);
    write_file_bytes(dir + "/plugstack.conf", "");

    const int controller_port = slurm_detail::bind_any(0), node_port = slurm_detail::bind_any(0);
    if (controller_port == 0 || node_port == 0 || controller_port == node_port) return fail("no free TCP ports");
    // The first job's MASTER_PORT is 15000 + id % 10000: pick an id whose port is free now.
    first_job_id_ = 0;
    for (int i = 0; i < 200 && first_job_id_ == 0; ++i) {
      const int id = 1000 + static_cast<int>((static_cast<unsigned>(::getpid()) * 7919u + static_cast<unsigned>(i) * 104729u +
                                              static_cast<unsigned>(controller_port)) % 9000u);
      if (slurm_detail::bind_any(15000 + id % 10000) != 0) first_job_id_ = id;
    }
    if (first_job_id_ == 0) return fail("no free port in 15000..24999 for the derived MASTER_PORT");

    const passwd* user = ::getpwuid(::geteuid());
    if (user == nullptr) return fail("no passwd entry for uid " + std::to_string(::geteuid()));
    const std::string user_name = user->pw_name;
    const unsigned cpus = std::max(2u, std::thread::hardware_concurrency());

    std::ostringstream conf;
    conf << "# Written by tests/support/slurm_cluster.h: one node, every file in this folder.\n"
         << "ClusterName=kilntest\n"
         << "SlurmctldHost=localhost(127.0.0.1)\n"  // a name slurmctld takes as this host's, whatever its name
         << "SlurmctldPort=" << controller_port << "\n"
         << "SlurmdPort=" << node_port << "\n"
         << "SlurmUser=" << user_name << "\nSlurmdUser=" << user_name << "\n"
         << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket << "\n"
         << "StateSaveLocation=" << dir << "/state\nSlurmdSpoolDir=" << dir << "/spool\n"
         << "SlurmctldPidFile=" << dir << "/slurmctld.pid\nSlurmdPidFile=" << dir << "/slurmd.pid\n"
         << "SlurmctldLogFile=" << dir << "/slurmctld.log\nSlurmdLogFile=" << dir << "/slurmd.log\n"
         << "SlurmctldDebug=info\nSlurmdDebug=info\n"
         << "PlugStackConfig=" << dir << "/plugstack.conf\n"
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         << "MpiDefault=none\nSwitchType=switch/none\nJobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
         << "ReturnToService=2\nSlurmdParameters=config_overrides\n"
         << "FirstJobId=" << first_job_id_ << "\n"
         << "NodeName=" << kNode << " NodeAddr=127.0.0.1 CPUs=" << cpus
         << " State=UNKNOWN\n"
         << "PartitionName=kiln Nodes=" << kNode << " Default=YES MaxTime=INFINITE State=UP\n";
    write_file_bytes(conf_, conf.str());

    // munged, then slurmctld once munge answers, then slurmd once slurmctld listens.
    if (!spawn("munged", {programs_[0], "--foreground", "--force", "--socket=" + socket, "--key-file=" + key,
                          "--pid-file=" + dir + "/munged.pid", "--log-file=" + dir + "/munged.log",
                          "--seed-file=" + dir + "/munged.seed"}))
      return false;
    while (!std::filesystem::exists(socket)) {
      if (const std::string exited = exited_daemon(); !exited.empty()) return fail(exited);
      if (Clock::now() > deadline) return fail("munged made no socket within " + std::to_string(kStartSeconds) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!spawn("slurmctld", {programs_[1], "-D", "-f", conf_})) return false;
    while (!port_accepts(controller_port)) {
      if (const std::string exited = exited_daemon(); !exited.empty()) return fail(exited);
      if (Clock::now() > deadline)
        return fail("slurmctld did not listen on port " + std::to_string(controller_port) + " within " +
                    std::to_string(kStartSeconds) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!spawn("slurmd", {programs_[2], "-D", "-N", kNode, "-f", conf_})) return false;
    std::string state;
    for (;;) {
      if (const std::string exited = exited_daemon(); !exited.empty()) return fail(exited);
      const CommandResult result =
          run_command(command_prefix() + "timeout -k 2 10 " + sinfo() + " -h -n " + kNode + " -o %T");
      state = result.output.substr(0, result.output.find_last_not_of(" \n") + 1);
      if (result.exit_code == 0 && state == "idle") return true;
      if (Clock::now() > deadline)
        return fail("sinfo did not show node " + std::string(kNode) + " idle within " + std::to_string(kStartSeconds) +
                    " s (last: '" + state + "')");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // slurmd first, then slurmctld, then munged: SIGTERM to the group, SIGKILL after 5 s; then what
  // is left of the jobs.
  void stop() {
    for (auto daemon = daemons_.rbegin(); daemon != daemons_.rend(); ++daemon) {
      if (daemon->pid <= 0) continue;
      ::kill(-daemon->pid, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      // Wait for the exit without reaping it, so the group id cannot be reused before its SIGKILL.
      for (siginfo_t info{}; ::waitid(P_PID, static_cast<id_t>(daemon->pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                             info.si_pid == 0;) {
        if (std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      ::kill(-daemon->pid, SIGKILL);  // it, if it is still there, and anything left in its group
      ::waitpid(daemon->pid, nullptr, 0);
      daemon->pid = -1;
    }
    daemons_.clear();
    kill_processes_of_this_cluster();
  }

  // Every process but this one whose environment has SLURM_CONF in root_: the daemons, a job step's
  // slurmstepd (which slurmd starts outside its process group) and its tasks, an srun.
  void kill_processes_of_this_cluster() {
    const std::string marker = "SLURM_CONF=" + root_.path() + "/";
    for (int round = 0; round < 5; ++round) {
      bool found = false;
      std::error_code error;
      for (auto entry = std::filesystem::directory_iterator("/proc", error);
           !error && entry != std::filesystem::directory_iterator(); entry.increment(error)) {
        const std::string name = entry->path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t pid = static_cast<pid_t>(std::stol(name));
        if (pid == ::getpid()) continue;
        const std::string environment = read_file_bytes("/proc/" + name + "/environ");
        for (size_t at = 0; at < environment.size(); at = environment.find('\0', at) + 1) {
          if (environment.compare(at, marker.size(), marker) == 0) {
            ::kill(pid, SIGKILL);
            found = true;
            break;
          }
          if (environment.find('\0', at) == std::string::npos) break;
        }
      }
      if (!found) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // The watchdog: /bin/sh reading a pipe whose write end only this process holds (close-on-exec,
  // so no child inherits it). The read ends when this process does; a destructor that ran kills the
  // watchdog first, so it acts only when the test was killed.
  void start_watchdog() {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) return;
    static const char* const kScript =
        "read _; root=$1\n"
        "for round in 1 2 3 4 5; do\n"
        "  found=\n"
        "  for p in /proc/[0-9]*; do\n"
        "    if tr '\\0' '\\n' < \"$p/environ\" 2>/dev/null | grep -qF \"SLURM_CONF=$root/\"; then\n"
        "      kill -9 \"${p#/proc/}\" 2>/dev/null; found=1\n"
        "    fi\n"
        "  done\n"
        "  [ -z \"$found\" ] && break\n"
        "  sleep 0.2\n"
        "done\n"
        "rm -rf \"$root\"\n";
    const std::string root = root_.path();
    const char* const arguments[] = {"/bin/sh", "-c", kScript, "kiln-slurm-watchdog", root.c_str(), nullptr};
    const char* const environment[] = {"PATH=/usr/bin:/bin", nullptr};  // no SLURM_CONF: not itself a target
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // out of the test's group: a Ctrl-C or a kill of the group leaves it
      ::dup2(ends[0], 0);
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      ::execve(arguments[0], const_cast<char* const*>(arguments), const_cast<char* const*>(environment));
      ::_exit(127);
    }
    ::close(ends[0]);
    if (pid < 0) {
      ::close(ends[1]);
      return;
    }
    watchdog_pid_ = pid;
    watchdog_pipe_ = ends[1];
  }

  void stop_watchdog() {
    if (watchdog_pid_ > 0) {
      ::kill(-watchdog_pid_, SIGKILL);
      ::kill(watchdog_pid_, SIGKILL);
      ::waitpid(watchdog_pid_, nullptr, 0);
    }
    if (watchdog_pipe_ >= 0) ::close(watchdog_pipe_);
    watchdog_pid_ = -1;
    watchdog_pipe_ = -1;
  }

  TempDir root_;     // removed last, once the daemons are stopped
  std::string dir_;  // this start's files: root_/attempt-N, a fresh folder per attempt
  int attempts_ = 0;
  std::vector<std::string> programs_;  // munged, slurmctld, slurmd, srun, sinfo
  std::vector<Daemon> daemons_;
  std::string conf_, reason_;
  int first_job_id_ = 0;
  pid_t watchdog_pid_ = -1;
  int watchdog_pipe_ = -1;
};

}  // namespace kiln::testing
