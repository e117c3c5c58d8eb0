// A tmux server of a test's own, on a private socket (tmux -S, in a temporary folder removed with
// it), for driving full-screen programs as a user would: each program runs in a detached session
// of its own size, and a test reads its screen (capture-pane), types into it (send-keys), resizes
// it, and asks tmux about its pane (a format such as #{alternate_on}). Panes stay after their
// program ends (remain-on-exit). The server also suits programs that must not outlive the test (a
// training run): on destruction every pane's process group is killed (SIGKILL), then the server.
//
// tmux comes from Debian's tmux package (scripts/install-deps.sh); tmux_available() says whether
// it is on PATH. A tmux command that fails throws std::runtime_error with tmux's message. Not
// thread-safe.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "support/kiln_process.h"
#include "support/temp_dir.h"

namespace kiln::testing {

inline bool tmux_available() { return run_command("command -v tmux").exit_code == 0; }

// `text` as one word of a POSIX shell command line.
inline std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

class TmuxServer {
 public:
  TmuxServer() {
    // No user configuration; the server stays up between sessions until destruction.
    tmux(
        "-f /dev/null start-server \\; set-option -g exit-empty off \\; "
        "set-option -g remain-on-exit on");
  }
  ~TmuxServer() {
    std::istringstream pids(run_command(command("list-panes -a -F '#{pane_pid}'")).output);
    for (pid_t pid = 0; pids >> pid;) ::kill(-pid, SIGKILL);  // a pane is its own process group
    run_command(command("kill-server"));
  }
  TmuxServer(const TmuxServer&) = delete;
  TmuxServer& operator=(const TmuxServer&) = delete;

  // Starts the shell command line `shell_command` in a new session of `columns` x `rows`;
  // returns its pane's id ("%3").
  std::string start(const std::string& shell_command, int columns = 120, int rows = 40) {
    std::string pane = tmux("new-session -d -P -F '#{pane_id}' -x " + std::to_string(columns) +
                            " -y " + std::to_string(rows) + " " + shell_quoted(shell_command));
    while (!pane.empty() && pane.back() == '\n') pane.pop_back();
    return pane;
  }

  // The pane's screen as text, one line per row.
  std::string capture(const std::string& pane) { return tmux("capture-pane -p -t " + pane); }

  // Types `keys` in tmux's names (q, C-c, Enter).
  void send_keys(const std::string& pane, const std::string& keys) {
    tmux("send-keys -t " + pane + " " + keys);
  }

  // Makes the pane's window `columns` x `rows`, as a user dragging the terminal's corner would.
  void resize(const std::string& pane, int columns, int rows) {
    tmux("resize-window -t " + pane + " -x " + std::to_string(columns) + " -y " +
         std::to_string(rows));
  }

  // A tmux format expanded for the pane: "#{pane_dead} #{pane_dead_status}" gives "1 0" once
  // its program has exited with status 0.
  std::string query(const std::string& pane, const std::string& format) {
    std::string answer = tmux("display-message -p -t " + pane + " " + shell_quoted(format));
    while (!answer.empty() && answer.back() == '\n') answer.pop_back();
    return answer;
  }

 private:
  std::string command(const std::string& arguments) const {
    return "tmux -S " + shell_quoted(socket_dir_ / "socket") + " " + arguments;
  }

  // Runs a tmux command; a failure throws with tmux's message.
  std::string tmux(const std::string& arguments) {
    const CommandResult result = run_command(command(arguments));
    if (result.exit_code != 0)
      throw std::runtime_error("tmux " + arguments + " failed: " + result.output);
    return result.output;
  }

  TempDir socket_dir_;
};

}  // namespace kiln::testing
