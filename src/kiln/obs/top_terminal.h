// The terminal while `kiln top` shows its live view, with ANSI escapes and termios.
//
// Construction needs standard input and output to be terminals (a kiln::Error saying so
// otherwise). It switches to the alternate screen (as top and htop do, so the shell's screen
// comes back afterwards), hides the cursor, puts the terminal in non-canonical no-echo mode with
// no signals from keys (Ctrl-C arrives as a key), and catches SIGINT, SIGTERM, SIGHUP (from
// elsewhere) and SIGWINCH. Destruction undoes all of it in reverse order, also when an exception
// unwinds; a caller that stops for a signal re-raises it after destruction, so its parent sees
// the signal. One TopTerminal at a time (the signal handlers are process-wide).
#pragma once

#include <termios.h>

#include <chrono>
#include <csignal>
#include <string_view>

namespace kiln {

class TopTerminal {
 public:
  TopTerminal();
  ~TopTerminal();
  TopTerminal(const TopTerminal&) = delete;
  TopTerminal& operator=(const TopTerminal&) = delete;

  // The size of the terminal on standard output now; 80 x 24 where it does not say.
  static int columns();
  static int rows();

  // Clears the screen and writes `frame` from the top left; its last line break is left out, so
  // a frame of exactly rows() lines does not scroll.
  void show(std::string_view frame);

  struct Wake {
    enum class Why { deadline, quit, resize, signal } why;
    int signal = 0;  // with Why::signal: SIGINT, SIGTERM or SIGHUP
  };
  // Waits until `deadline`, a key that quits (q, Ctrl-C; a hang-up of the terminal counts as
  // one), a change of the terminal's size, or a signal that stops; other keys are read and
  // ignored.
  Wake wait_until(std::chrono::steady_clock::time_point deadline);

 private:
  void release_signals();  // the handlers as they were, and the wake-up pipe closed

  termios saved_mode_{};
  struct sigaction saved_actions_[4] = {};  // SIGINT, SIGTERM, SIGHUP, SIGWINCH
};

}  // namespace kiln
