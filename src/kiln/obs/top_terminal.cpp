#include "kiln/obs/top_terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr int kCaughtSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
// Alternate screen on, cursor hidden; and back.
constexpr std::string_view kEnterView = "\x1b[?1049h\x1b[?25l";
constexpr std::string_view kLeaveView = "\x1b[?25h\x1b[?1049l";
constexpr std::string_view kHomeAndClear = "\x1b[H\x1b[2J";

// The signal handler writes the signal's number here and wait_until() reads it: the one thing a
// handler may safely do that a poll() sees.
int wake_pipe[2] = {-1, -1};

extern "C" void on_signal(int signal) {
  const int saved_errno = errno;
  const auto number = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = ::write(wake_pipe[1], &number, 1);
  errno = saved_errno;
}

bool write_all(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(STDOUT_FILENO, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

winsize terminal_size() {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_col == 0 || size.ws_row == 0)
    size = {.ws_row = 24, .ws_col = 80, .ws_xpixel = 0, .ws_ypixel = 0};
  return size;
}

}  // namespace

TopTerminal::TopTerminal() {
  KILN_CHECK(::isatty(STDIN_FILENO) && ::isatty(STDOUT_FILENO),
             "kiln top shows a live view on a terminal, and standard {} is not one: give --once to "
             "print one frame (watch -n 1 kiln top --once ... refreshes one)",
             ::isatty(STDIN_FILENO) ? "output" : "input");
  KILN_CHECK(wake_pipe[0] < 0, "kiln top: one live view at a time");
  KILN_CHECK(::tcgetattr(STDIN_FILENO, &saved_mode_) == 0,
             "kiln top: cannot read the terminal's mode: {}", std::strerror(errno));
  KILN_CHECK(::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "kiln top: cannot make a pipe: {}",
             std::strerror(errno));
  static_assert(sizeof(saved_actions_) / sizeof(saved_actions_[0]) == std::size(kCaughtSignals));
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kCaughtSignals); ++i)
    ::sigaction(kCaughtSignals[i], &action, &saved_actions_[i]);
  termios mode = saved_mode_;
  mode.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ISIG);
  mode.c_cc[VMIN] = 1;
  mode.c_cc[VTIME] = 0;
  if (::tcsetattr(STDIN_FILENO, TCSANOW, &mode) != 0) {
    const int error = errno;
    release_signals();
    fail("kiln top: cannot set the terminal's mode: {}", std::strerror(error));
  }
  write_all(kEnterView);  // a terminal that takes no output fails the first show()
}

TopTerminal::~TopTerminal() {
  write_all(kLeaveView);
  ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_mode_);
  release_signals();
}

void TopTerminal::release_signals() {
  for (size_t i = 0; i < std::size(kCaughtSignals); ++i)
    ::sigaction(kCaughtSignals[i], &saved_actions_[i], nullptr);
  ::close(wake_pipe[0]);
  ::close(wake_pipe[1]);
  wake_pipe[0] = wake_pipe[1] = -1;
}

int TopTerminal::columns() { return terminal_size().ws_col; }

int TopTerminal::rows() { return terminal_size().ws_row; }

void TopTerminal::show(std::string_view frame) {
  if (frame.ends_with('\n')) frame.remove_suffix(1);
  std::string screen(kHomeAndClear);
  screen += frame;
  KILN_CHECK(write_all(screen), "kiln top: cannot write to the terminal: {}", std::strerror(errno));
}

TopTerminal::Wake TopTerminal::wait_until(std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  while (true) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= milliseconds(0)) return {Wake::Why::deadline};
    pollfd watched[2] = {{.fd = STDIN_FILENO, .events = POLLIN, .revents = 0},
                         {.fd = wake_pipe[0], .events = POLLIN, .revents = 0}};
    const auto timeout = std::chrono::ceil<milliseconds>(left).count();
    if (::poll(watched, 2, static_cast<int>(timeout)) < 0) {
      KILN_CHECK(errno == EINTR, "kiln top: cannot wait for the terminal: {}",
                 std::strerror(errno));
      continue;
    }
    if (watched[1].revents & POLLIN) {
      bool resized = false;
      unsigned char signal = 0;
      while (::read(wake_pipe[0], &signal, 1) == 1) {
        if (signal != SIGWINCH) return {Wake::Why::signal, signal};
        resized = true;
      }
      if (resized) return {Wake::Why::resize};
    }
    if (watched[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char keys[64];
      const ssize_t count = ::read(STDIN_FILENO, keys, sizeof(keys));
      if (count < 0 && errno == EINTR) continue;
      if (count <= 0) return {Wake::Why::quit};  // the terminal hung up
      // Not 'Q': a terminal's F2 sends ESC O Q.
      for (ssize_t i = 0; i < count; ++i)
        if (keys[i] == 'q' || keys[i] == '\x03') return {Wake::Why::quit};
    }
  }
}

}  // namespace kiln
